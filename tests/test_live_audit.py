"""The hourly look at what a relay's open live subscriptions asked for (``LiveCoverage.
run_audits``, ``constants.LIVE_AUDIT_SECS``), in one process (tests/manager_harness.py): an
event the look brings that came live is no evidence; one that never came, dated while the
subscriptions were open, was missed, and they are opened anew. The relay that drops them is
tests/test_engine_public_relays.py's ``test_live_events_a_relay_drops_without_a_word_...``."""
from gsync import constants
from gsync.protocol import messages as wire
from gsync.sync.relay_state import ConnectionStatus

from .factory import Author, announcement, issue
from .manager_harness import ManagerHarness

A = "wss://a.example"
owner = Author.named("audit-owner")


def synced(tmp_path):
    h = ManagerHarness(tmp_path)
    ann = announcement(owner, "audited", relays=[A])
    h.own_relay_holds(ann)
    h.connect(A)
    h.settle(A)
    assert h.state(A).historic_sync_completed_at is not None
    live = next(sub for sub, f in h.state(A).current.live_subs.items() if not f.control)
    return h, ann, live


def look(h):
    """An hour on, ticks answering nothing: the audit's REQ (``since``, no ``limit: 0``)."""
    sent = len(h.historic_reqs(A))
    for _ in range(int(constants.LIVE_AUDIT_SECS / 60) + 2):
        h.advance(60)
        h.tick()
        reqs = h.historic_reqs(A)[sent:]
        if reqs:
            [req] = reqs
            assert all("since" in flt for flt in req[2:])
            return req[1]
    raise AssertionError("no audit within the hour")


def test_an_event_that_came_live_is_not_judged_missed(tmp_path):
    h, ann, live = synced(tmp_path)
    bug = issue(Author.named("audit-dev"), ann, created_at=int(h.clock.now) + 30)
    h.advance(60)
    h.relay_sends(A, live, bug)  # live, as it was stored
    sub = look(h)
    h.relay_sends(A, sub, bug)  # and again by the look
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert live in h.state(A).current.live_subs  # not opened anew
    assert h.state(A).current.audit_batch is None


def test_an_event_that_never_came_live_is_missed_and_the_live_subscriptions_open_anew(tmp_path):
    h, ann, live = synced(tmp_path)
    bug = issue(Author.named("audit-dev"), ann, created_at=int(h.clock.now) + 30)
    sub = look(h)  # (the relay stored it and sent nothing)
    h.relay_sends(A, sub, bug)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert h.manager.delivery.is_tracked(bug.id)  # delivered now
    assert live not in h.state(A).current.live_subs  # opened anew
    assert any(not f.control for f in h.state(A).current.live_subs.values())


def test_the_first_look_reaches_back_to_when_the_live_subscriptions_opened(tmp_path):
    """An event the relay stored while its historic sync ran, after the REQs that would have
    brought it, and never sent live (a relay dropping live subscriptions): the first look
    asks from the round's start, when those subscriptions opened, not from the sync's end
    (from there it waited for the next daily sync; a first sync of many pages takes minutes)."""
    h = ManagerHarness(tmp_path)
    ann = announcement(owner, "gap", relays=[A])
    h.own_relay_holds(ann)
    h.connect(A)
    bug = issue(Author.named("audit-dev"), ann, created_at=int(h.clock.now) + 2)  # after the first REQs
    h.settle(A)
    assert h.state(A).historic_sync_completed_at > bug.created_at + 5
    sub = look(h)
    [req] = [r for r in h.historic_reqs(A) if r[1] == sub]
    assert all(flt["since"] <= bug.created_at for flt in req[2:])
    h.relay_sends(A, sub, bug)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert h.manager.delivery.is_tracked(bug.id)


def test_a_fresh_start_other_than_the_daily_syncs_completes_and_the_looks_go_on(tmp_path):
    """A relay's sync started again on its live connection by something other than its daily
    sync (here: a relay asked precisely, and a repository listing it by an owner new to it)
    is syncing until its batches end, then complete, and its hourly look goes on. Before,
    only the daily sync moved the status: this fresh start left it Connected, never
    completed, and the looks stopped until the next day (the simulator's seed 903 of a
    20-relay world: a reaction on a relay dropping live subscriptions came 5 h late)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "precise", relays=[A]))
    h.state(A).precise_queries = True  # learnt in an earlier session (saved)
    h.connect(A)
    h.settle(A)
    assert h.state(A).status is ConnectionStatus.CONNECTED
    first = h.state(A).historic_sync_completed_at
    h.advance(600)
    h.own_relay_holds(announcement(Author.named("audit-newcomer"), "newcomers", relays=[A]))
    assert h.state(A).status is ConnectionStatus.SYNCING  # started again, the newcomer asked too
    h.settle(A)
    assert h.state(A).status is ConnectionStatus.CONNECTED
    assert h.state(A).historic_sync_completed_at > first
    look(h)  # within the hour


def test_the_relays_looks_come_together_once_an_hour(tmp_path):
    """One relay's look due pulls in every relay whose look would fall due within half an
    interval; one synced later than that waits for its own hour."""
    b, c = "wss://b.example", "wss://c.example"
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "together", relays=[A, b, c]))
    h.connect(A)
    h.settle(A)
    h.advance(constants.LIVE_AUDIT_SECS * 0.4)
    h.connect(b)
    h.settle(b)
    h.advance(constants.LIVE_AUDIT_SECS * 0.2)
    h.connect(c)
    h.settle(c)
    sent = {url: len(h.historic_reqs(url)) for url in (A, b, c)}

    def looked():
        return {url for url in (A, b, c) if h.historic_reqs(url)[sent[url]:]}

    while not looked():
        h.advance(60)
        h.tick()
    # A's hour is up; b synced 40 % of one later (due within half an interval), c 60 %
    assert looked() == {A, b}
    at = h.clock.now

    def answer_and_wait():
        for url in looked():
            for req in h.historic_reqs(url)[sent[url]:]:
                h.relay_says(url, wire.Eose(req[1]))
        h.tick()
        sent.update({url: len(h.historic_reqs(url)) for url in (A, b, c)})
        while not looked():
            h.advance(60)
            h.tick()

    answer_and_wait()
    # c's own hour (0.6 of one after A's and b's looks: theirs due within half an interval)
    assert looked() == {A, b, c} and h.clock.now - at < constants.LIVE_AUDIT_SECS * 0.7
    at = h.clock.now
    answer_and_wait()
    assert looked() == {A, b, c}  # together from now on, once an hour
    assert constants.LIVE_AUDIT_SECS <= h.clock.now - at <= constants.LIVE_AUDIT_SECS + 60


def test_an_announcement_not_ours_that_came_live_is_not_judged_missed(tmp_path):
    """Layer 1's live subscription brings every announcement; one of a repository that does
    not list this relay is dropped (remembered with the refused, not as seen). Brought again
    by the look, it was not missed: the live subscriptions stay (on a public relay, every
    hour's look would reopen them all)."""
    h, ann, live = synced(tmp_path)
    l1 = next(sub for sub, f in h.state(A).current.live_subs.items() if f.control)
    theirs = announcement(Author.named("audit-stranger"), "elsewhere", relays=["wss://elsewhere.example"],
                          created_at=int(h.clock.now) + 30)
    h.advance(60)
    h.relay_sends(A, l1, theirs)  # live, dropped as not ours
    sub = look(h)
    h.relay_sends(A, sub, theirs)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert live in h.state(A).current.live_subs  # not opened anew


def test_an_event_refused_and_released_then_brought_by_the_look_is_not_judged_missed(tmp_path):
    """An issue dated ahead of the clock came live, the own relay refused it (too far in the
    future), its time came and it was released to be fetched again by id; the relay served
    nothing by id (the simulator, seed 6 of the suite's world: a relay in its ids-unserved
    fault). The look brings it: delivered, but it came live, so the live subscriptions stay."""
    from gsync.io.inbox import DeliveryAnswered

    h, ann, live = synced(tmp_path)
    ahead = issue(Author.named("audit-early"), ann, created_at=int(h.clock.now) + 1200)
    h.relay_sends(A, live, ahead)
    h.feed(DeliveryAnswered(ahead, "rejected", "invalid: created_at too late", A))
    assert ahead.id in h.manager.rejected
    h.advance(1300)
    h.tick()  # its time came: released, asked by id
    assert ahead.id not in h.manager.rejected
    for req in h.historic_reqs(A):
        if any(ahead.id in flt.get("ids", ()) for flt in req[2:]):
            h.relay_says(A, wire.Eose(req[1]))  # served nothing by id
    sub = look(h)
    h.relay_sends(A, sub, ahead)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert h.manager.delivery.is_tracked(ahead.id)  # delivered again
    assert live in h.state(A).current.live_subs  # not opened anew


def test_after_the_own_relay_came_back_the_look_starts_from_its_return(tmp_path):
    """The own relay back from an outage: what gsync had is forgotten (``seen`` emptied, so
    the catch-up delivers again what it may have lost), and an event that came live before
    would be taken for one never had (the simulator, seeds 11 and 14 of the suite's world).
    The next look asks from the return on: what came live before it is not judged missed."""
    from gsync.io.inbox import OwnRelayState

    h, ann, live = synced(tmp_path)
    bug = issue(Author.named("audit-dev"), ann, created_at=int(h.clock.now) + 30)
    h.advance(60)
    h.relay_sends(A, live, bug)  # live, as it was stored
    h.advance(600)
    h.feed(OwnRelayState(False, h.clock.now))
    h.advance(60)
    h.feed(OwnRelayState(True, h.clock.now))
    back = h.clock.now
    session = h.state(A).current
    for _ in range(int(constants.LIVE_AUDIT_SECS / 60) + 2):
        h.advance(60)
        h.tick()
        audit = [sub for sub, batch in session.sub_to_batch.items() if batch == session.audit_batch]
        if audit:
            break
        for sub_id in h.conn(A).subscriptions.keys() - session.live_subs.keys():
            h.relay_says(A, wire.Eose(sub_id))  # (the catch-up from before the outage: served)
    reqs = [r for r in h.historic_reqs(A) if r[1] in audit]
    assert reqs and all(flt["since"] >= int(back) for req in reqs for flt in req[2:])
    for sub in audit:
        h.relay_sends(A, sub, bug)  # (a relay reading since loosely; where a filter matches)
        h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert live in h.state(A).current.live_subs  # not opened anew


def test_a_session_begun_after_the_own_relays_return_looks_no_further_back(tmp_path):
    """As above, the relay reconnecting after the own relay's return: its new session has no
    look of its own yet and would look back to the historic sync before the outage (a year of
    seed 7 with --drops-live 0.2, day 260: a comment that came live judged missed)."""
    from gsync.io.inbox import OwnRelayState, RelayDisconnected

    h, ann, live = synced(tmp_path)
    h.advance(600)
    h.feed(OwnRelayState(False, h.clock.now))
    h.advance(60)
    h.feed(OwnRelayState(True, h.clock.now))
    back = h.clock.now
    h.feed(RelayDisconnected(A, h.state(A).session, "gone"))
    h.advance(30)
    h.connect(A)
    h.settle(A)
    # a session that keeps an earlier completion (``run_audits``: a quick reconnect's), from
    # before the outage: its first look would reach back two intervals
    h.state(A).historic_sync_completed_at = back - 1800
    session = h.state(A).current
    for _ in range(2 * int(constants.LIVE_AUDIT_SECS / 60) + 2):
        h.advance(60)
        h.tick()
        audit = [sub for sub, batch in session.sub_to_batch.items() if batch == session.audit_batch]
        if audit:
            break
        h.answer_own_reads()
        for sub_id in h.conn(A).subscriptions.keys() - session.live_subs.keys():
            h.relay_says(A, wire.Eose(sub_id))
    reqs = [r for r in h.historic_reqs(A) if r[1] in audit]
    assert reqs and all(flt["since"] >= int(back) for req in reqs for flt in req[2:])



def test_an_event_dated_before_its_new_coverage_went_live_is_brought_but_not_judged_missed(tmp_path):
    """A root the own relay accepts between two looks: its thread's live subscription opens
    at once (new coverage), its history comes from a batch of its own. A reply stored before
    that, which the history did not bring (here its page came back empty: a relay's time
    budget can stop one before its first event), comes with the look, as anything gsync lacks
    does; but the live subscription missed nothing: it opened after the reply. Judged missed,
    every live subscription of the relay was opened anew (the simulator, seed 1403 of
    ``--slow-queries 0.4``)."""
    from .factory import comment

    h, ann, live = synced(tmp_path)
    h.advance(constants.LIVE_AUDIT_SECS / 2)
    h.tick()
    dev = Author.named("audit-dev")
    root = issue(dev, ann, created_at=int(h.clock.now) - 600)
    reply = comment(dev, root, created_at=int(h.clock.now) - 300)  # on the relay before gsync knew the root
    h.own_relay_holds(root)
    session = h.state(A).current
    fresh = [s for s, sub in session.live_subs.items() if any(root.id in f.to_json() for f in sub.filters)]
    assert fresh and all(session.live_subs[s].fresh for s in fresh)
    h.settle(A)  # the root's history: nothing
    assert not h.manager.delivery.is_tracked(reply.id)
    sub = look(h)
    [req] = [r for r in h.historic_reqs(A) if r[1] == sub]
    assert any(root.id in str(flt) and flt["since"] <= reply.created_at for flt in req[2:])  # asked all the same
    h.relay_sends(A, sub, reply)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert h.manager.delivery.is_tracked(reply.id)  # delivered
    assert session.audit_batch is None
    assert live in session.live_subs and all(s in session.live_subs for s in fresh)  # not opened anew


def test_an_event_dated_after_its_new_coverage_went_live_is_judged_missed(tmp_path):
    """The other side of the test above: what new coverage's live subscription should have
    sent, dated after its REQ went, and that came only with the look, was missed."""
    h, ann, live = synced(tmp_path)
    h.advance(constants.LIVE_AUDIT_SECS / 2)
    h.tick()
    dev = Author.named("audit-dev")
    root = issue(dev, ann, created_at=int(h.clock.now) - 600)
    h.own_relay_holds(root)
    h.settle(A)
    from .factory import comment

    reply = comment(dev, root, created_at=int(h.clock.now) + 30)
    sub = look(h)
    h.relay_sends(A, sub, reply)
    h.relay_says(A, wire.Eose(sub))
    h.tick()
    assert h.manager.delivery.is_tracked(reply.id)
    assert live not in h.state(A).current.live_subs  # opened anew


def look_reqs(h, session, answer=lambda req: ()):
    """The next look's REQs, each answered as it goes (``answer(req)``: events to send before
    its EOSE), till the look ends; every other REQ answered with nothing (the catch-up of
    live subscriptions opened anew, a proof: one left unanswered stalls, and its shape goes
    alone on this relay)."""
    while True:
        h.advance(20)
        h.tick()
        if session.audit_batch is not None:
            break
        h.eose_all(A)
        h.answer_own_reads()
    batch, reqs = session.audit_batch, []
    while session.audit_batch == batch:
        for req in h.historic_reqs(A):
            if req[1] not in h.conn(A).subscriptions or req[1] in session.live_subs:
                continue
            if session.sub_to_batch.get(req[1]) == batch:
                reqs.append(req)
                for event in answer(req):
                    h.relay_sends(A, req[1], event)
            h.relay_says(A, wire.Eose(req[1]))
        h.advance(1)
        h.tick()
    return reqs


def test_a_relay_seen_dropping_live_subscriptions_and_not_proven_to_answer_several_filters_is_looked_at_one_filter_a_req(tmp_path):
    """The look stands in for live subscriptions a relay drops without a word (ORLY); one
    that also answers the first filter of each REQ alone, holding too little to be caught so,
    had every look answer that filter only, and what came to the others waited for its next
    daily sync (the simulator's seed 974 of a 30-relay world: a patch, 8 h). Once a look
    found events its live subscriptions missed, a relay not proven to answer several filters
    of a REQ is looked at one filter a REQ (remembered over restarts); proven, in one REQ
    again. A relay never seen dropping them is looked at in one REQ (a NIP-77 relay answers
    id fetches of one filter and stays unproven all day: its looks one filter a REQ cost the
    suite's world half as many messages again)."""
    from gsync.sync import memory

    from .factory import comment

    h, ann, packed_live = synced(tmp_path)
    session = h.state(A).current
    dev = Author.named("audit-dev")
    bug = issue(dev, ann, created_at=int(h.clock.now) + 30)
    [packed] = look_reqs(h, session, lambda req: [bug])  # never seen dropping: one REQ
    assert len(packed) > 4 and not h.state(A).filters_answered
    assert h.state(A).live_dropped_at is not None  # the issue was missed: the relay drops them
    live = [r for r in h.reqs(A) if r[1].startswith("live-")]
    before = [r for r in live if r[1] == packed_live]
    after = live[live.index(before[-1]) + 1:]
    assert all(flt.get("limit") == 0 for r in before for flt in r[2:])
    # opened anew as such a relay keeps them (ORLY drops ``limit: 0``): ``since``, no ``limit``
    assert after and all("limit" not in flt and "since" in flt for r in after for flt in r[2:])
    h.own_relay_holds(bug)  # (delivered: its thread is covered)
    h.settle(A)
    reply = comment(dev, bug, created_at=int(h.clock.now) + 30)
    looked = look_reqs(h, session, lambda req: [reply] if bug.id in str(req[2]) else [])
    assert len(looked) > len(packed) - 2 and all(len(req) == 3 for req in looked)  # ["REQ", id, one filter]
    assert bug.id not in str(looked[0])  # (not the first filter: a relay answering that one alone dropped it)
    assert h.manager.delivery.is_tracked(reply.id)
    # asked the proof, as a relay polled one filter a REQ is: two events it served, in one REQ
    # of two filters (both served, it is proven and its looks are packed again)
    assert any(len(r) == 4 and all(set(f) == {"ids"} for f in r[2:]) for r in h.historic_reqs(A))
    restored = type(h.state(A))(A)
    memory.restore_relay(restored, memory.relay_memory(h.state(A), {}), None)
    assert restored.live_dropped_at == h.state(A).live_dropped_at  # over restarts
    h.state(A).filters_answered = True  # proven (an answer that needed two filters)
    proven = look_reqs(h, session)
    assert len(proven) < len(looked) <= sum(len(req) - 2 for req in proven)  # the same filters, packed


def test_a_relay_keeping_live_subscriptions_and_not_proven_to_answer_several_filters_is_asked_the_proof(tmp_path):
    """A relay syncing by NIP-77 (exchanges and id fetches are one filter each) is never
    proven to answer several filters of a REQ by its sync; one that also drops its live
    subscriptions and answers the first filter of a REQ alone had every hourly look answer
    that filter only, so no look found what its live subscriptions missed, and it was never
    seen dropping them (the simulator's seed 2507 of a 50-relay world: a comment, 9 h). Any
    relay unproven is asked the proof once a day: two events it served, in one REQ of two
    filters of one id each."""
    h, ann, live = synced(tmp_path)
    session = h.state(A).current
    dev = Author.named("audit-dev")
    bugs = [issue(dev, ann, subject=f"bug {n}", created_at=int(h.clock.now) + 30 + n) for n in range(2)]
    h.advance(60)
    h.relay_sends(A, live, *bugs)  # (they came live: the look finds nothing missed)
    look_reqs(h, session, lambda req: bugs)
    state = h.state(A)
    assert state.live_dropped_at is None and not state.filters_answered
    proofs = [r for r in h.historic_reqs(A) if len(r) == 4 and all(set(f) == {"ids"} and len(f["ids"]) == 1
                                                                   for f in r[2:])]
    assert len(proofs) == 1 and {f["ids"][0] for f in proofs[0][2:]} == {b.id for b in bugs}


def test_live_drops_are_forgotten_a_month_after_the_last(tmp_path):
    """A relay seen dropping live subscriptions is remembered so for a month after the last
    look that found it (``constants.LIVE_DROPS_REMEMBERED_SECS``); its daily fresh start
    forgets it after that (a relay whose software changed is looked at in one REQ again)."""
    h, _, _ = synced(tmp_path)
    state = h.state(A)

    def daily_sync(dropped_ago):
        state.live_dropped_at = seen = h.clock.now - dropped_ago
        state.next_daily_at = h.clock.now + 1
        h.advance(2)
        h.tick()
        assert state.next_daily_at > h.clock.now + 3600  # (it ran)
        h.settle(A)
        return state.live_dropped_at == seen

    assert daily_sync(constants.LIVE_DROPS_REMEMBERED_SECS - 3600)
    assert not daily_sync(constants.LIVE_DROPS_REMEMBERED_SECS)
    assert state.live_dropped_at is None
