"""Coverage a relay refused by policy is not asked again before its probe (SPEC §5), whatever
rebuilds live coverage meanwhile: a real ``SyncManager`` with recorded effects and a fake
clock (tests/manager_harness.py), fed the relay's answers."""
import json

from gsync import constants
from gsync.io.inbox import HandshakeDone, RelayDisconnected
from gsync.protocol import messages as wire
from gsync.protocol.messages import parse_relay_message
from gsync.sim.relay import filter_from_json
from gsync.sync.policy import coverage_key, describe

from .factory import Author, announcement
from .manager_harness import FakeWs, ManagerHarness

A = "wss://a.example"


def closed(sub_id, text):
    return parse_relay_message(json.dumps(["CLOSED", sub_id, text]))


def live_reqs(h):
    """Live REQs (``limit: 0``) sent to A, in order, with the connection they went on."""
    return [(n, f) for n, conn in enumerate(h.effects.connections[A]) for f in conn.frames
            if f[0] == "REQ" and all(flt.get("limit") == 0 for flt in f[2:])]


def keys(req):
    return {coverage_key(filter_from_json(flt)) for flt in req[2:]}


def test_a_consolidation_before_the_verdict_keeps_each_refused_shape_alone(tmp_path):
    """A live REQ of several shapes is refused by policy (``blocked:``) and split, one shape a
    REQ; the relay answers none of them (its subscription cap, say) before a consolidation
    rebuilds live coverage. The rebuild keeps each shape alone: the culprit's lone REQ is its
    second ask, refused, paused; a later rebuild asks it no more (three asks within the
    hour, before: packed again, refused, split, asked alone again: seed 2 of 6/20/10)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    state = h.state(A)
    multi = [f for _, f in live_reqs(h) if len(keys(f)) > 1]
    assert multi, live_reqs(h)
    refused = multi[0]
    h.relay_says(A, closed(refused[1], "blocked: not here"))
    split = [f for _, f in live_reqs(h)][len(live_reqs(h)) - len(keys(refused)):]
    assert all(len(keys(f)) == 1 for f in split) and set().union(*map(keys, split)) == keys(refused)
    culprit = next(iter(keys(split[-1])))

    sent = len(live_reqs(h))
    h.manager.live.consolidate(state)  # before any verdict
    rebuilt = [f for _, f in live_reqs(h)[sent:]]
    assert all(len(keys(f)) == 1 for f in rebuilt if keys(f) & keys(refused)), rebuilt
    lone = [f for f in rebuilt if culprit in keys(f)]
    assert len(lone) == 1
    h.relay_says(A, closed(lone[0][1], "blocked: not this one"))
    assert state.paused.is_paused(culprit)

    sent = len(live_reqs(h))
    h.manager.live.consolidate(state)
    assert not [f for _, f in live_reqs(h)[sent:] if culprit in keys(f)]
    asks = [f for _, f in live_reqs(h) if culprit in keys(f)]
    assert len(asks) == 3  # the refused REQ, its split, the rebuild's lone REQ: two after the refusal


def test_shapes_served_alone_are_packed_together_again(tmp_path):
    """The split's innocent shapes answer (EOSE): cleared, a rebuild packs them as before;
    the culprit, refused alone, is paused and left out."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    state = h.state(A)
    refused = next(f for _, f in live_reqs(h) if len(keys(f)) > 2)
    h.relay_says(A, closed(refused[1], "blocked: not here"))
    split = [f for _, f in live_reqs(h)][len(live_reqs(h)) - len(keys(refused)):]
    culprit, innocent = split[0], split[1:]
    h.relay_says(A, closed(culprit[1], "blocked: not this one"))
    for f in innocent:
        h.relay_says(A, wire.Eose(f[1]))
    sent = len(live_reqs(h))
    h.manager.live.consolidate(state)
    rebuilt = [f for _, f in live_reqs(h)[sent:]]
    together = set().union(*map(keys, innocent))
    assert any(keys(f) >= together for f in rebuilt), rebuilt
    assert not [f for f in rebuilt if keys(f) & keys(culprit)]


def test_a_reconnect_before_the_verdict_keeps_each_shape_of_a_refused_historic_req_alone(tmp_path):
    """A historic REQ of several shapes refused by policy; the connection drops before the
    split REQs are answered. The next session's REQs (live and historic) hold each of those
    shapes alone."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    refused = next(f for f in h.historic_reqs(A) if len(keys(f)) > 1)
    h.relay_says(A, closed(refused[1], "blocked: not here"))
    h.feed(RelayDisconnected(A, h.state(A).session, "gone"))
    h.advance(60)
    h.tick()
    h.feed(HandshakeDone(A, h.state(A).attempt, ws=FakeWs()))
    for _ in range(10):
        h.answer_own_reads()
        h.advance(1.1)
        h.eose_all(A)
    again = [f for f in h.reqs(A) if keys(f) & keys(refused)]
    assert again and all(len(keys(f) & keys(refused)) == 1 for f in again)


def _one_shape_paused(h, repos):
    """``repos`` (listing a) held, a connected: its live REQ of several shapes refused, then
    the lone shape at fault refused too: paused. That shape's key."""
    h.own_relay_holds(*repos)
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    multi = [f for _, f in live_reqs(h) if len(keys(f)) > 1]
    h.relay_says(A, closed(multi[0][1], "blocked: not here"))
    lone = [f for _, f in live_reqs(h)][-1]
    culprit = next(iter(keys(lone)))
    sent = len(h.historic_reqs(A))
    h.relay_says(A, closed(lone[1], "blocked: not this one"))
    assert h.state(A).paused.is_paused(culprit)
    # asked once more without notes (``protocol.precise``: it may have been refused for
    # them), refused so too: about the shape
    h.advance(1.1)
    probe = [r for r in h.historic_reqs(A)[sent:] if any(f"#{culprit[1][0]}" in f for f in r[2:])]
    assert len(probe) == 1 and 1 not in probe[0][2]["kinds"]
    h.relay_says(A, closed(probe[0][1], "blocked: not this one"))
    assert h.state(A).paused.is_paused(culprit) and not h.state(A).precise_refused
    return culprit


def test_a_pause_is_saved_at_the_next_tick_and_the_next_process_keeps_it(tmp_path):
    """A policy pause is saved at the next tick, not within the 30 s of other state: a
    process killed a few seconds after the refusal leaves the next one the pause, which
    does not ask the refused shape again (seed 169's 60 days: killed after the pause and
    before the save, the next process asked the relay again what it had refused)."""
    repos = [announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)]
    h = ManagerHarness(tmp_path)
    culprit = _one_shape_paused(h, repos)
    h.advance(2)
    h.tick()  # the next tick: then killed, nothing more saved
    h.manager.saved.close()  # (its lock on state_dir goes with the process)

    again = ManagerHarness(tmp_path)  # the next process, on the same state_dir
    again.own_relay_holds(*repos)
    assert again.state(A).paused.is_paused(culprit)
    again.connect(A)
    again.answer_own_reads()
    again.advance(1.1)
    assert not [f for _, f in live_reqs(again) if culprit in keys(f)]


def test_a_relay_retired_and_listed_again_is_not_asked_what_it_refused_before_its_probe(tmp_path):
    """Seed 615 of ``--fault-scale 2 --own-full 1``: a relay asked for repositories the own
    relay lost was retired while what it brought waited for a full disk, and listed again a
    minute later: a new registration, its pauses gone, asked a refused ``#q`` at once. A
    retired relay's paused coverage is kept until its probes are due."""
    owners = [Author.named(f"u{i}") for i in range(3)]
    repos = [announcement(owner, f"r{i}", relays=[A]) for i, owner in enumerate(owners)]
    h = ManagerHarness(tmp_path)
    culprit = _one_shape_paused(h, repos)
    moved = [announcement(owner, f"r{i}", relays=["wss://b.example"], created_at=repos[i].created_at + 10)
             for i, owner in enumerate(owners)]
    h.settle(A)
    h.own_relay_holds(*moved)  # no repository lists a any more: retired
    h.advance(2)
    h.tick()
    assert A not in h.manager.relays
    back = [announcement(owner, f"r{i}", relays=[A], created_at=repos[i].created_at + 20)
            for i, owner in enumerate(owners)]
    h.own_relay_holds(*back)  # a minute later, listed again
    h.advance(60)
    sent = len(h.effects.connections[A])
    h.connect(A)
    h.answer_own_reads()
    h.advance(3)
    assert h.state(A).paused.is_paused(culprit)
    asked = [f for n, conn in enumerate(h.effects.connections[A]) if n >= sent for f in conn.frames
             if f[0] == "REQ"]
    assert asked and not [f for f in asked if culprit in keys(f)]


def _anti_sync_bots(h, answered: set, refused_tag: str | None = None, unanswered: set | None = None) -> None:
    """A answers each REQ not answered yet as khatru's ``AntiSyncBots`` policy does: a filter
    that may bring kind-1 notes (no ``kinds``, or 1 among them) naming no authors refuses the
    whole REQ; anything else is served (nothing found). ``refused_tag``: a tag it refuses too;
    ``unanswered``: the first REQ asking without notes is left unanswered (its id added)."""
    for req in h.reqs(A):
        if req[1] in answered:
            continue
        answered.add(req[1])
        if unanswered is not None and not unanswered and any(
                f.get("kinds") and 1 not in f["kinds"] and 1617 in f["kinds"] for f in req[2:]):
            unanswered.add(req[1])
            continue
        if refused_tag is not None and any(f"#{refused_tag}" in f for f in req[2:]):
            h.relay_says(A, closed(req[1], f"blocked: #{refused_tag} queries are not allowed here"))
        elif any(not f.get("authors") and (not f.get("kinds") or 1 in f["kinds"]) for f in req[2:]):
            h.relay_says(A, closed(req[1], "blocked: an author must be specified to get their kind:1 notes"))
        else:
            h.relay_says(A, wire.Eose(req[1]))


def test_a_relay_refusing_tag_filters_without_kinds_is_asked_them_with_kinds_but_notes(tmp_path):
    """khatru's AntiSyncBots refuses every tag filter of ours (no ``kinds``): it was paused,
    shape after shape, and nothing of a repository came from there. Now the first refused is
    asked once more without notes, is served, the pauses are lifted, and its tag filters ask
    NIP-34's kinds but notes from then on; nothing stays paused."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    answered: set = set()
    state = h.state(A)
    for _ in range(40):
        h.answer_own_reads()
        _anti_sync_bots(h, answered)
        h.advance(1.1)
    assert state.precise_refused and not state.paused
    last = {req[1]: req for req in h.reqs(A)}  # (a sub id's latest REQ)
    live = [last[sub_id] for sub_id in state.current.live_subs]  # the live coverage kept open
    tagged = [f for req in live for f in req[2:] if any(k.startswith("#") for k in f)]
    assert tagged and all(1 not in f.get("kinds", [1]) for f in tagged)
    assert any(f.get("#a") and 1617 in f["kinds"] for f in tagged)  # a repository's patches too
    assert state.status.name == "CONNECTED"  # synced: every filter served


def test_a_relay_found_refusing_notes_is_asked_them_again_a_month_later(tmp_path):
    """The verdict was kept for good: a relay that stopped refusing notes was never asked
    them again. Now its first daily sync a month after asks with notes: still refusing them,
    it is found so again (and not before the month)."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    _run(h, lambda: _anti_sync_bots(h, answered), 40)
    state = h.state(A)
    assert state.precise_refused
    found_at = state.precise_refused_at

    def daily_sync():
        state.next_daily_at = h.clock.now
        h.tick()

    state.precise_refused_at -= constants.NOTES_REFUSAL_REMEMBERED_SECS - 3600  # (a month but an hour)
    daily_sync()
    assert state.precise_refused
    state.precise_refused_at -= 3600
    before = len(h.reqs(A))
    daily_sync()
    assert not state.precise_refused
    _run(h, lambda: _anti_sync_bots(h, answered), 40)
    asked = [f for req in h.reqs(A)[before:] for f in req[2:]]
    assert any(any(k.startswith("#") for k in f) and "kinds" not in f for f in asked)  # with notes again
    assert state.precise_refused and state.precise_refused_at > found_at and not state.paused


def test_a_refusal_that_ends_before_its_kinds_probe_restores_the_shape_not_a_relay_without_notes(tmp_path):
    """A relay refuses ``#a`` as a policy of the moment ("blocked: #a queries are not allowed
    here") and has ended it by the time the kinds probe comes, which it serves (it holds
    nothing: EOSE alone). Taken for AntiSyncBots, the relay was asked without notes for good
    (saved): its notes tagging a repository never came (the simulator's seed 4003, day
    112.09). Now the shape is asked once more as it was; served, it is restored: asked as
    before, nothing paused. (A relay refusing notes refuses that ask: the tests below.)"""
    h = _three_repositories_on_a(tmp_path)
    policy = {"on": True}

    def answer(req):
        if _is_kinds_probe_of_a(req):
            policy["on"] = False  # (the policy is over by then)
        if policy["on"] and any("#a" in f for f in req[2:]):
            h.relay_says(A, closed(req[1], "blocked: #a queries are not allowed here"))
        else:
            h.relay_says(A, wire.Eose(req[1]))

    _answer_each_req(h, answer)
    state = h.state(A)
    assert not policy["on"]  # (the kinds probe went)
    assert not state.precise_refused and not state.paused
    last = {req[1]: req for req in h.reqs(A)}
    live = [f for sub_id in state.current.live_subs for f in last[sub_id][2:]]
    assert any("#a" in f and "kinds" not in f for f in live)  # asked as it was, live again
    assert state.status.name == "CONNECTED"


def test_an_imprecise_check_refused_for_want_of_auth_is_no_verdict(tmp_path):
    """The check that follows a served kinds probe comes back ``auth-required:``: about us,
    not the shape nor its notes. The relay is not taken for one refusing notes (asked
    without them for good), and the shape is not taken for served either."""
    h = _three_repositories_on_a(tmp_path)
    seen = {"probe": False, "check": None}

    def answer(req):
        probe = _is_kinds_probe_of_a(req)
        if seen["probe"] and seen["check"] is None and any("#a" in f for f in req[2:]) and not probe:
            seen["check"] = req[1]
            h.relay_says(A, closed(req[1], "auth-required: we only serve our members"))
        elif probe:
            seen["probe"] = True
            h.relay_says(A, wire.Eose(req[1]))
        elif not seen["probe"] and any("#a" in f for f in req[2:]):
            h.relay_says(A, closed(req[1], "blocked: #a queries are not allowed here"))
        else:
            h.relay_says(A, wire.Eose(req[1]))

    _answer_each_req(h, answer)
    state = h.state(A)
    assert seen["check"] is not None
    assert not state.precise_refused
    assert state.paused.is_paused(coverage_key(filter_from_json(
        next(f for f in h.reqs(A) if f[1] == seen["check"])[2])))


def test_an_imprecise_check_left_unanswered_is_asked_again_not_taken_for_a_refusal(tmp_path):
    """AntiSyncBots again; the check that follows its served kinds probe (the refused shape
    asked as it was) stalls: no answer is no refusal, it is asked again, refused, and only
    then is the relay asked without notes."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    seen = {"probe_served": False, "left": []}

    def answer():
        for req in h.reqs(A):
            if req[1] in answered:
                continue
            if seen["probe_served"] and not seen["left"] and any(
                    any(k.startswith("#") for k in f) and "kinds" not in f for f in req[2:]):
                answered.add(req[1])
                seen["left"].append(req[1])  # (the check: left unanswered)
                continue
            if any(f.get("kinds") and 1 not in f["kinds"] and 1617 in f["kinds"] for f in req[2:]):
                seen["probe_served"] = True
        _anti_sync_bots(h, answered)

    _run(h, answer, 60)
    state = h.state(A)
    assert seen["left"] and state.precise_refused and not state.paused
    reqs = h.reqs(A)
    left = next(i for i, req in enumerate(reqs) if req[1] == seen["left"][0])
    assert any(req[2:] == reqs[left][2:] for req in reqs[left + 1:])  # the check asked again


def test_a_kinds_probe_its_session_ended_is_asked_again_in_the_next(tmp_path):
    """AntiSyncBots again; its kinds probe is out when the relay's sync starts again (found to
    answer one filter a REQ, say): that session's probe and its suspects end with it, and the
    shapes it paused stayed paused a day (the simulator's seed 9009 of a precise-only world).
    The next session asks them without notes again, and the relay is asked so."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    probes: list = []

    def answer():
        for req in h.reqs(A):
            if req[1] not in answered and any(
                    f.get("kinds") and 1 not in f["kinds"] and 1617 in f["kinds"] for f in req[2:]):
                probes.append(req[1])
                if len(probes) == 1:
                    answered.add(req[1])  # (left unanswered: the session ends first)
                    h.manager.lifecycle.fresh_start(h.state(A), h.clock.now)
        _anti_sync_bots(h, answered)

    _run(h, answer, 60)
    state = h.state(A)
    assert len(probes) >= 2 and state.precise_refused and not state.paused


def test_a_relay_refusing_one_tag_after_serving_the_others_has_that_tag_paused_not_kinds_asked(tmp_path):
    """A relay refusing ``#q`` (say) serves ``#a``: the refusal is about the shape, as before."""
    h = ManagerHarness(tmp_path)
    culprit = _one_shape_paused(h, [announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    assert not h.state(A).precise_refused and h.state(A).paused.is_paused(culprit)


def test_a_relay_refusing_notes_and_one_tag_has_that_tag_alone_paused(tmp_path):
    """The same relay refusing ``#a`` besides: its kinds probe is refused too (about the
    shape), the next refused shape's probe is served, and every pause is lifted but ``#a``'s."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    answered: set = set()
    for _ in range(40):
        h.answer_own_reads()
        _anti_sync_bots(h, answered, refused_tag="a")
        h.advance(1.1)
    state = h.state(A)
    assert state.precise_refused
    assert [describe(k) for k in state.paused.keys()] == ["#a"]


def test_a_kinds_probe_left_unanswered_is_asked_again(tmp_path):
    """Its first probe without notes stalls (a REQ beside others a NOTICE refused, naming
    none): asked again once the stall ends it, served, and nothing stays paused (it stayed
    paused a day: seed 593 of own-relay faults with --anti-sync-bots and --limit-refusals)."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    unanswered: set = set()
    _run(h, lambda: _anti_sync_bots(h, answered, unanswered=unanswered), 60)
    state = h.state(A)
    assert unanswered and state.precise_refused and not state.paused


def test_a_kinds_probe_left_unanswered_is_not_asked_again_by_missing_event_recovery(tmp_path):
    """A relay refuses ``#a`` in any form (and serves the rest). Paused, ``#a`` is asked once
    more without notes (it may have been refused for them); that probe stalls (a REQ beside
    others a NOTICE refused, naming none), is asked again and refused: about the shape. A
    probe owes no events: its stall goes to no missing-event recovery, which asked it once
    more, outside the probe's rules, a few minutes after the refusal (the simulator's seed
    901 of a 20-relay world, ``refused_asked_again``)."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    unanswered: set = set()
    _run(h, lambda: _refusing_tag(h, answered, "a", unanswered), 40)
    _run(h, lambda: _refusing_tag(h, answered, "a", unanswered), 30, step=60)  # (recovery's attempts come)
    state = h.state(A)
    assert unanswered and not state.precise_refused and [describe(k) for k in state.paused.keys()] == ["#a"]
    without_notes = [req[1] for req in h.reqs(A)
                     if any("#a" in f and f.get("kinds") and 1 not in f["kinds"] for f in req[2:])]
    assert len(without_notes) == 2  # the probe that stalled, and asked again


def test_a_coverage_probe_left_unanswered_is_asked_again_within_the_hour(tmp_path):
    """A shape refused by policy is paused a day, then probed. A probe the relay leaves
    unanswered (its REQ stalls: a relay that answers slowly, or drops it) tells nothing:
    taken as a refusal, the shape stayed paused a day more (the simulator's seed 2125 of
    the stress world: a relay answering in 40 s, ``#e`` paused a day more there, and a
    reply only it held came 19 h late). It is asked again within the hour."""
    h = _three_repositories_on_a(tmp_path)
    answered: set = set()
    asked_q: list[float] = []

    def answer(refuse_q: bool, silent_q: bool = False) -> None:
        for req in h.reqs(A):
            if req[1] in answered:
                continue
            answered.add(req[1])
            if not any("#q" in f for f in req[2:]):
                h.relay_says(A, wire.Eose(req[1]))
                continue
            asked_q.append(h.clock.now)
            if refuse_q:
                h.relay_says(A, closed(req[1], "blocked: #q queries are not allowed here"))
            elif not silent_q:
                h.relay_says(A, wire.Eose(req[1]))

    _run(h, lambda: answer(refuse_q=True), 40)
    state = h.state(A)
    assert [describe(k) for k in state.paused.keys()] == ["#q"]
    refused_at = asked_q[-1]
    # (its daily sync, drawn 23-25 h on, falls within the probe's minute now and then and asks
    # again: a fresh start is not the subject)
    state.next_daily_at = h.clock.now + 3 * constants.POLICY_PROBE_SECS
    h.advance(constants.POLICY_PROBE_SECS)
    _run(h, lambda: answer(refuse_q=False, silent_q=True), 40)  # the probe stalls (30 s)
    probes = [t for t in asked_q if t > refused_at]
    assert len(probes) == 1 and state.paused.keys()
    _run(h, lambda: answer(refuse_q=False), 40, step=120)
    again = [t for t in asked_q if t > probes[0]]
    assert again and again[0] - probes[0] <= constants.POLICY_PROBE_UNANSWERED_SECS + 300
    assert not state.paused.keys()  # served: restored


def _refusing_tag(h, answered: set, tag: str, unanswered: set) -> None:
    """A answers each REQ not answered yet: one asking ``#tag`` is refused by policy (the
    whole REQ), but the first asking it without notes, left unanswered (its id added to
    ``unanswered``); anything else is served (nothing found)."""
    for req in h.reqs(A):
        if req[1] in answered:
            continue
        answered.add(req[1])
        if not any(f"#{tag}" in f for f in req[2:]):
            h.relay_says(A, wire.Eose(req[1]))
        elif not unanswered and any(f"#{tag}" in f and 1 not in f.get("kinds", [1]) for f in req[2:]):
            unanswered.add(req[1])
        else:
            h.relay_says(A, closed(req[1], f"blocked: #{tag} queries are not allowed here"))


def _three_repositories_on_a(tmp_path) -> ManagerHarness:
    """Three repositories listing A, and A connected."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    h.connect(A)
    return h


def _is_kinds_probe_of_a(req) -> bool:
    return any("#a" in f and f.get("kinds") and 1 not in f["kinds"] for f in req[2:])


def _answer_each_req(h, answer, rounds: int = 40) -> None:
    """``rounds`` times: the own relay's reads answered, each REQ of A's not answered yet
    by ``answer(req)``, and the pacing gate's second on."""
    answered: set = set()
    for _ in range(rounds):
        h.answer_own_reads()
        for req in h.reqs(A):
            if req[1] not in answered:
                answered.add(req[1])
                answer(req)
        h.advance(1.1)


def _run(h, answer, rounds: int, step: float = 1.1) -> None:
    """``rounds`` times: the own relay's reads answered, A's REQs by ``answer``, ``step``
    seconds on (the pacing gate), and a maintenance tick (it finds stalls)."""
    for _ in range(rounds):
        h.answer_own_reads()
        answer()
        h.advance(step)
        h.tick()


def test_a_precise_probe_refused_for_its_shape_pauses_the_shape_it_was_made_from(tmp_path):
    """A relay answering only precise queries refuses a shape by policy only when asked it
    precisely: its precise probe (``#a`` with NIP-34's kinds) is refused, and the REQs asking
    ``#a`` plainly, answered with nothing, went on being asked (the simulator's seed 2501 of a
    50-relay world, ``refused_asked_again``). The refusal pauses ``#a`` there, as a REQ of that
    shape refused alone would; one for our rate pauses nothing."""
    from gsync.io.inbox import ProbeRefused, ProbeWanted
    from gsync.protocol.filters import Filter

    from .factory import repo_addr

    owner = Author.named("probe-owner")
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "probed", relays=[A]))
    h.connect(A)
    h.settle(A)
    state = h.state(A)
    tagged = Filter.make(tags={"a": [repo_addr(owner, "probed")]}, limit=5000)
    for prefix, text, paused in (("rate-limited", "slow down", False),
                                 ("blocked", "#a queries are not allowed here", True)):
        h.feed(ProbeWanted(A, state.session, (tagged,)))
        assert state.current.probe_source == tagged  # (asked precisely: ``#a`` with kinds)
        h.feed(ProbeRefused(A, state.session, prefix, text))
        assert state.paused.is_filter_paused(tagged) is paused
