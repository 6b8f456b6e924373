"""gsync/io/connection.py without a socket: what one relay session does with each frame.

Frames are fed to ``RelayConnection._handle_frame`` as the reader would; what the manager
would receive is collected from ``post``, and drops are read from the metrics.
"""
from __future__ import annotations

import json

import pytest
from gevent.queue import Queue

from gsync import constants
from gsync.io import connection
from gsync.io.connection import (
    NEG_INBOX_FRAMES,
    NOTICE_ECHO_SECS,
    NOTICE_PREFIX_REFUSAL_SECS,
    NOTICE_REFUSAL_SECS,
    RelayConnection,
)
from gsync.io.inbox import RelayDisconnected, RemoteEvents, RemoteMessage
from gsync.ops import metrics
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter, FilterSet

from . import factory as f

URL = "wss://relay.example"
REPO = "30617:" + "ab" * 32 + ":proj"


class FakeWs:
    connected = True

    def close(self, timeout=1):
        self.connected = False


def dropped(reason: str) -> float:
    return metrics.DROPS.labels(reason)._value.get()


def hangups(reason: str) -> float:
    return metrics.HANGUPS.labels(reason)._value.get()


@pytest.fixture
def session():
    posted = []
    conn = RelayConnection(URL, FakeWs(), 1, posted.append)
    conn.subscriptions["s"] = FilterSet([Filter.make(kinds=[1621], tags={"a": [REPO]})])
    conn.posted = posted
    return conn


def frame(*items) -> bytes:
    return json.dumps(list(items)).encode()


def events_posted(conn) -> list:
    conn._flush_events()
    return [e.event.id for m in conn.posted if isinstance(m, RemoteEvents) for e in m.events]


def test_an_off_filter_event_is_dropped_before_its_signature_is_checked(session):
    note = f.Author.named("x").sign(1, [], "not for us").to_dict()
    forged = dict(note, sig="0" * 128)
    before_sig, before_off = dropped("bad_signature"), dropped("no_matching_filter")
    session._handle_frame(frame("EVENT", "s", forged))
    assert dropped("no_matching_filter") == before_off + 1
    assert dropped("bad_signature") == before_sig  # never checked: it was not asked for


def test_a_matching_forgery_is_checked_and_dropped(session):
    issue = f.issue(f.Author.named("y"), REPO, subject="forged").to_dict()
    before = dropped("bad_signature")
    session._handle_frame(frame("EVENT", "s", dict(issue, sig="0" * 128)))
    assert dropped("bad_signature") == before + 1
    assert events_posted(session) == []
    genuine = f.issue(f.Author.named("y"), REPO, subject="genuine")
    session._handle_frame(frame("EVENT", "s", genuine.to_dict()))
    assert events_posted(session) == [genuine.id]


def test_nip77_frames_go_to_their_exchange_and_a_stream_past_its_inbox_is_dropped(session):
    mine, other = Queue(), Queue()
    session.neg_waiters.update({"neg-a": mine, "neg-b": other})
    before = dropped("unsolicited_negentropy")
    for _ in range(NEG_INBOX_FRAMES + 10):
        session._handle_frame(frame("NEG-MSG", "neg-a", "61"))
    assert mine.qsize() == NEG_INBOX_FRAMES and other.qsize() == 0
    assert dropped("unsolicited_negentropy") == before + 10
    session._handle_frame(frame("NEG-ERR", "neg-zzz", "error: who are you"))
    assert dropped("unsolicited_negentropy") == before + 11
    session._handle_frame(frame("NOTICE", "error: bad negentropy message"))
    assert other.qsize() == 1  # a NOTICE about NIP-77 may concern any exchange


def test_an_overdrawn_budget_hangs_up_and_asks_for_backoff(session):
    before = hangups("misbehaving")
    stray = f.Author.named("z").sign(1, [], "stray").to_dict()
    # the budget refills with time (10 points a second): twice the budget spent at any speed a
    # loaded machine runs this loop overdraws it, where the budget and five would need 0.5 s
    for _ in range(2 * constants.MISBEHAVIOUR_BUDGET):
        session._handle_frame(frame("EVENT", "never-opened", stray))
        if session.closed:
            break
    assert session.closed
    assert hangups("misbehaving") == before + 1
    gone = [m for m in session.posted if isinstance(m, RelayDisconnected)]
    assert len(gone) == 1 and gone[0].misbehaved


def test_notices_are_counted_by_prefix_and_spend_the_budget(session):
    before = metrics.NOTICES.labels("rate-limited")._value.get()
    session._handle_frame(frame("NOTICE", "rate-limited: slow down"))
    assert metrics.NOTICES.labels("rate-limited")._value.get() == before + 1
    # as above: twice the budget overdraws it however slowly a loaded machine runs the loop
    # (the budget and five failed once in a run under load: the budget had refilled meanwhile)
    for _ in range(2 * constants.MISBEHAVIOUR_BUDGET):
        session._handle_frame(frame("NOTICE", "hello"))
        if session.closed:
            break
    assert session.closed


def _sent(conn) -> list:
    """What the connection queued for the relay, decoded."""
    out = []
    while not conn._outbox.empty():
        out.append(json.loads(conn._outbox.get_nowait()))
    return out


def _closed_posted(conn) -> list:
    return [(m.message.sub_id, m.message.text) for m in conn.posted
            if isinstance(m, RemoteMessage) and isinstance(m.message, wire.Closed)]


def test_a_notice_refusing_past_the_cap_closes_the_last_req_not_yet_answered(session):
    # "too many subscriptions" in a NOTICE names no REQ. A relay reads in order and refuses
    # the REQ it just read, so the last one sent that it has not answered is taken as the
    # one refused: the manager hears its CLOSED, and a CLOSE goes out in case that guess
    # was wrong. One that was answered (its EOSE, or an event) is never taken.
    flt = [Filter.make(kinds=[1621], tags={"a": [REPO]})]
    for sub_id in ("a", "b", "c"):
        session.subscribe(sub_id, flt)
    session._handle_frame(frame("EOSE", "c"))
    session._handle_frame(frame("EVENT", "b", f.issue(f.Author.named("z"), REPO).to_dict()))
    _sent(session)
    session._handle_frame(frame("NOTICE", "rejected: too many subscriptions"))
    assert _closed_posted(session) == [("a", "rejected: too many subscriptions")]
    assert _sent(session) == [["CLOSE", "a"]]
    assert set(session.subscriptions) == {"s", "b", "c"}
    assert session._budget.points == session._budget.capacity  # an answer, not misbehaviour
    # Nothing left to refuse: the next such NOTICE is only a NOTICE (a rate, to the manager).
    session._handle_frame(frame("NOTICE", "ERROR: bad req: too many concurrent REQs"))
    assert len(_closed_posted(session)) == 1
    assert isinstance(session.posted[-1].message, wire.Notice)


def test_a_notice_takes_the_newest_waiting_req_and_not_an_old_one(session, monkeypatch):
    flt = [Filter.make(kinds=[1621], tags={"a": [REPO]})]
    clock = [1000.0]
    monkeypatch.setattr(connection.time, "monotonic", lambda: clock[0])
    session.subscribe("old", flt)
    clock[0] += NOTICE_REFUSAL_SECS + 1  # a relay that never sends EOSE left it waiting
    session._handle_frame(frame("NOTICE", "too many concurrent REQs"))
    assert _closed_posted(session) == []
    session.subscribe("new-1", flt)
    session.subscribe("new-2", flt)
    for _ in range(2):  # a burst over the cap: one NOTICE for each REQ refused, newest first
        session._handle_frame(frame("NOTICE", "too many concurrent REQs"))
    assert [sub for sub, _ in _closed_posted(session)] == ["new-2", "new-1"]
    # A rate limit said in a NOTICE alone refuses the same way (the REQ waits out the
    # cooldown whole, instead of stalling and being split); other NOTICEs are what they were.
    session.subscribe("new-3", flt)
    session._handle_frame(frame("NOTICE", "too many negentropy sessions"))
    session._handle_frame(frame("NOTICE", "hello"))
    assert len(_closed_posted(session)) == 2
    session._handle_frame(frame("NOTICE", "rate-limited: slow down"))
    assert _closed_posted(session)[-1] == ("new-3", "slow down")


def test_a_notice_repeating_a_closed_just_received_is_only_counted(session, monkeypatch):
    # Some relays say a refusal twice, in a CLOSED and in a NOTICE: the second must not
    # take another REQ down with it, nor start a rate-limit episode of its own.
    flt = [Filter.make(kinds=[1621], tags={"a": [REPO]})]
    clock = [1000.0]
    monkeypatch.setattr(connection.time, "monotonic", lambda: clock[0])
    session.subscribe("served", flt)
    session.subscribe("refused", flt)
    session._handle_frame(frame("CLOSED", "refused", "rate-limited: too many requests"))
    session._handle_frame(frame("NOTICE", "rate-limited: slow down"))
    assert _closed_posted(session) == [("refused", "too many requests")]  # the relay's own
    assert not any(isinstance(m, RemoteMessage) and isinstance(m.message, wire.Notice)
                   for m in session.posted)
    assert "served" in session.subscriptions
    clock[0] += NOTICE_ECHO_SECS + 1  # later, it is a refusal of its own again
    session._handle_frame(frame("NOTICE", "rate-limited: slow down"))
    assert _closed_posted(session)[-1] == ("served", "slow down")


def test_what_a_relay_ignoring_since_sends_is_dropped_without_a_hang_up(session):
    # A poll or a reconnect asks since a time; a relay that ignores it sends a page of
    # older events that match everything else. Counted and dropped, but not misbehaviour:
    # 1,200 of them (past the budget of 1,000 points) do not end the session.
    now = 1_800_000_000
    session.subscriptions["since"] = FilterSet([Filter.make(kinds=[1621], tags={"a": [REPO]}, since=now)])
    author = f.Author.named("old")
    before = dropped("outside_time_bounds"), dropped("no_matching_filter")
    for n in range(constants.MISBEHAVIOUR_BUDGET + 200):
        old = f.issue(author, REPO, subject=f"old {n}", created_at=now - 3600 - n)
        session._handle_frame(frame("EVENT", "since", old.to_dict()))
    assert not session.closed
    assert dropped("outside_time_bounds") == before[0] + constants.MISBEHAVIOUR_BUDGET + 200
    assert dropped("no_matching_filter") == before[1]
    assert events_posted(session) == []
    # An event that matches nothing else still costs a point.
    note = author.sign(1, [], "not for us", now + 1).to_dict()
    session._handle_frame(frame("EVENT", "since", note))
    assert dropped("no_matching_filter") == before[1] + 1


def test_a_hang_up_just_after_a_long_message_names_it(session, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("gsync.io.connection.time.monotonic", lambda: clock[0])
    assert session.sent_too_long() == 0  # nothing long sent: an ordinary disconnect
    session._note_long(["x" * 100, "y" * 70_000, "z" * 20_000])
    clock[0] += 1
    assert session.sent_too_long() == 70_000  # the longest of those just sent
    clock[0] += constants.HANGUP_AFTER_LONG_SECS + 1
    assert session.sent_too_long() == 0  # long ago: not why the relay left now
    assert session.sent_too_long(close_status=1009) == 70_000  # unless it says "too big"
    assert session.sent_too_long(close_status=1000) == 0


def test_nip77_frames_fit_the_relays_messages():
    from gsync.io.negentropy_sync import FRAME_SIZE_LIMIT, frame_size_limit
    from gsync.protocol.negentropy import MIN_FRAME_SIZE_LIMIT
    assert frame_size_limit(constants.MAX_MESSAGE_BYTES) == FRAME_SIZE_LIMIT
    assert 2 * frame_size_limit(16_384) + 100 <= 16_384  # hex doubles it; the envelope fits
    assert frame_size_limit(1_000) == MIN_FRAME_SIZE_LIMIT


def test_after_a_subscription_ended_its_matching_events_are_kept_and_its_echoes_cost_nothing(session):
    """Some relays send a subscription's events after its CLOSED, or EOSE / CLOSED again:
    what matches the ended filters is kept (late, harmless), the echoes are counted as
    ended_subscription and spend no misbehaviour point; an event matching nothing still
    costs one."""
    session.forget("s")  # the relay closed it
    late = f.issue(f.Author.named("y"), REPO, subject="late")
    stray = f.Author.named("z").sign(1, [], "stray").to_dict()
    before_ended, before_off = dropped("ended_subscription"), dropped("no_matching_filter")
    points = session._budget.points
    session._handle_frame(frame("EVENT", "s", late.to_dict()))
    for _ in range(3):
        session._handle_frame(frame("EOSE", "s"))
        session._handle_frame(frame("CLOSED", "s", "error: shutting down"))
    assert events_posted(session) == [late.id]
    assert dropped("ended_subscription") == before_ended + 6
    assert session._budget.points >= points  # (it only refills meanwhile)
    session._handle_frame(frame("EVENT", "s", stray))
    assert dropped("no_matching_filter") == before_off + 1
    assert not session.closed


def test_a_req_sent_again_under_the_id_of_one_the_relay_ended_has_its_answers_told(session):
    """A live REQ closed "rate-limited:" waits out the cooldown and goes again under its id
    (seed 91's year, day 204.95): the relay's EOSE and CLOSED to the new REQ are its
    answers, not echoes of the old one's end. Dropped as such, a policy refusal never
    reached the manager, and the refused tag was asked twice more at once."""
    session.forget("s")  # the relay closed it ("rate-limited: slow down")
    session.posted.clear()
    session.req_frame("s", [Filter.make(kinds=[1621], tags={"e": ["ab" * 32]}, limit=0)])
    session._handle_frame(frame("CLOSED", "s", "blocked: #e queries are not allowed here"))
    told = [m.message for m in session.posted if isinstance(m, RemoteMessage)]
    assert [(type(m), m.sub_id) for m in told] == [(wire.Closed, "s")]
    session.posted.clear()
    session.req_frame("s", [Filter.make(kinds=[1621], limit=0)])  # and once more: its EOSE
    session._handle_frame(frame("EOSE", "s"))
    assert [(type(m.message), m.message.sub_id) for m in session.posted] == [(wire.Eose, "s")]


# -- a NEG-OPEN refused for want of AUTH -------------------------------------------------


def exchange_opened(conn, sub_id: str = "neg1-7") -> tuple[Queue, str]:
    """An exchange as negentropy_sync runs one: registered, then its NEG-OPEN sent."""
    inbox = Queue()
    conn.open_negentropy(sub_id, inbox)
    opening = wire.neg_open(sub_id, Filter.make(kinds=[30617]), "6100000200")
    conn.send_negentropy(sub_id, opening)
    return inbox, opening


def keyed_session() -> RelayConnection:
    from gsync.protocol.event import generate_secret

    return RelayConnection(URL, FakeWs(), 1, [].append, auth_secret=generate_secret())


@pytest.mark.parametrize("refusal", [("NEG-ERR", "neg1-7", "auth-required: you must auth"),
                                     ("CLOSED", "neg1-7", "auth-required: you must auth")])
def test_a_neg_open_refused_for_auth_is_sent_again_after_our_auth_once(refusal):
    conn = keyed_session()
    inbox, opening = exchange_opened(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame(*refusal))
    out = _sent(conn)
    assert [m[0] for m in out] == ["NEG-OPEN", "AUTH", "NEG-OPEN"]  # our AUTH goes first
    assert out[2] == json.loads(opening)
    assert inbox.empty()  # the exchange waits for the answer to the one sent again
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    conn._handle_frame(frame(*refusal))  # (sent before the OK: perhaps read before it took our AUTH)
    assert _sent(conn) == [json.loads(opening)] and inbox.empty()
    conn._handle_frame(frame(*refusal))  # refused again after it took our AUTH: the exchange's answer
    assert _sent(conn) == [] and inbox.qsize() == 1


# khatru (the Go relay framework many relays are built on) challenges only with a refusal
# (its AUTH frame comes with each one) and reads each message in a goroutine of its own: the
# REQ or NEG-OPEN sent again just after our AUTH is read while the AUTH's signature is still
# being checked, and refused auth-required again; its OK to our AUTH follows.


def test_a_req_refused_again_before_the_relay_took_our_auth_goes_once_more_when_it_does():
    conn = _keyed_with_reqs("h1", "h2")
    for sub_id in ("h1", "h2"):  # (a challenge with each refusal, the same one)
        conn._handle_frame(frame("AUTH", "challenge-1"))
        conn._handle_frame(frame("CLOSED", sub_id, "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "REQ", "AUTH", "REQ", "REQ"]
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))  # read before it took our AUTH
    assert _sent(conn) == [] and _closed_posted(conn) == []  # held for its answer to our AUTH
    assert "h1" in conn._unanswered  # (a relay that never says OK to it: the REQ stalls)
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    assert [(m[0], m[1]) for m in _sent(conn)] == [("REQ", "h1")]
    conn._handle_frame(frame("CLOSED", "h2", "auth-required: authenticate first"))  # read before it too
    assert [(m[0], m[1]) for m in _sent(conn)] == [("REQ", "h2")]  # at once: the OK came
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    assert _closed_posted(conn) == [("h1", "authenticate first")] and _sent(conn) == []  # final now


def test_reqs_refused_again_in_notices_before_the_relay_took_our_auth_go_once_more_when_it_does():
    """The same told in NOTICEs naming nothing (``_auth_notice``): the REQs sent again after
    our AUTH and refused so again before the relay's OK go once more on the OK; a NOTICE
    after that refuses (the newest waiting REQ, as any refusing NOTICE)."""
    conn = _keyed_with_reqs("h1", "h2")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    for _ in range(2):
        conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "REQ", "AUTH", "REQ", "REQ"]
    for _ in range(2):  # read before it took our AUTH
        conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert _sent(conn) == [] and _closed_posted(conn) == []
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    assert sorted(m[1] for m in _sent(conn)) == ["h1", "h2"]
    conn._handle_frame(frame("EOSE", "h1"))
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert _closed_posted(conn) == [("h2", "authenticate first")]


def test_a_req_refused_again_after_the_relay_took_our_auth_or_restricted_is_final():
    conn = _keyed_with_reqs("h1", "h2")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    conn._handle_frame(frame("CLOSED", "h2", "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "REQ", "AUTH", "REQ", "REQ"]
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    assert _closed_posted(conn) == [("h1", "authenticate first")]  # sent after the OK: final
    other = _keyed_with_reqs("h1")
    other._handle_frame(frame("AUTH", "challenge-1"))
    other._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    other._handle_frame(frame("CLOSED", "h1", "restricted: not a member"))  # allowed no more: final
    assert _closed_posted(other) == [("h1", "not a member")]


def test_a_refusal_held_for_our_auths_answer_is_told_when_the_relay_refuses_our_auth():
    conn = _keyed_with_reqs("h1")
    inbox, _ = exchange_opened(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    conn._handle_frame(frame("NEG-ERR", "neg1-7", "auth-required: authenticate first"))
    conn._handle_frame(frame("CLOSED", "h1", "auth-required: authenticate first"))
    conn._handle_frame(frame("NEG-ERR", "neg1-7", "auth-required: authenticate first"))
    assert _closed_posted(conn) == [] and inbox.empty()
    conn._handle_frame(frame("OK", conn._auth_event_id, False, "restricted: not a member"))
    assert _closed_posted(conn) == [("h1", "authenticate first")] and inbox.qsize() == 1


def exchange_sent_again_after_auth(reason: str):
    """A keyed session whose exchange's NEG-OPEN the relay refused ``reason`` before our
    AUTH: sent again after it. (conn, its inbox, the NEG-OPEN)"""
    conn = keyed_session()
    inbox, opening = exchange_opened(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NEG-ERR", "neg1-7", reason))
    assert [m[0] for m in _sent(conn)] == ["NEG-OPEN", "AUTH", "NEG-OPEN"]
    return conn, inbox, opening


def test_a_neg_open_refused_again_before_the_relay_took_our_auth_goes_once_more_when_it_does():
    conn, inbox, opening = exchange_sent_again_after_auth("auth-required: you must auth")
    conn._handle_frame(frame("NEG-ERR", "neg1-7", "auth-required: you must auth"))
    assert _sent(conn) == [] and inbox.empty()  # held for its answer to our AUTH
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    assert _sent(conn) == [json.loads(opening)] and inbox.empty()
    conn._handle_frame(frame("NEG-MSG", "neg1-7", "61"))
    assert inbox.qsize() == 1  # the exchange goes on
    conn.end_negentropy("neg1-7")
    assert not (conn._neg_resent or conn._held_for_auth or conn._neg_opens)


def test_a_neg_open_answered_is_never_sent_again_and_an_exchange_ended_leaves_nothing():
    conn = keyed_session()
    inbox, _ = exchange_opened(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NEG-MSG", "neg1-7", "61"))
    conn._handle_frame(frame("NEG-ERR", "neg1-7", "auth-required: after an answer"))
    assert [m[0] for m in _sent(conn)] == ["NEG-OPEN", "AUTH"] and inbox.qsize() == 2
    conn.end_negentropy("neg1-7")
    assert not conn.neg_waiters and not conn._neg_opens


@pytest.mark.parametrize("keyed", [True, False])
def test_a_neg_open_refused_for_auth_without_a_key_or_a_challenge_is_the_exchanges_refusal(keyed):
    conn = keyed_session() if keyed else RelayConnection(URL, FakeWs(), 1, [].append)
    inbox, _ = exchange_opened(conn)
    if not keyed:
        conn._handle_frame(frame("AUTH", "challenge-1"))  # challenged, nothing to answer with
    before = dropped("unknown_subscription")
    conn._handle_frame(frame("CLOSED", "neg1-7", "auth-required: you must auth"))
    assert [m[0] for m in _sent(conn)] == ["NEG-OPEN"]
    assert inbox.qsize() == 1  # its exchange fails now, not at its deadline
    assert dropped("unknown_subscription") == before  # a CLOSED naming an exchange is not junk


def test_a_notice_refusing_by_its_prefix_closes_the_req_just_sent_and_only_that_soon(session, monkeypatch):
    """nostream validates a REQ as it reads it and refuses one with a tag key it does not
    take (``#E``) in a NOTICE alone: ``invalid: ...``, no CLOSED, no EOSE. Taken as the
    CLOSED of the last REQ sent and not answered, if it went within
    NOTICE_PREFIX_REFUSAL_SECS and no other went then and waits (a stray NOTICE, or one
    about another REQ, must not pause a REQ's coverage); an unprefixed one is only a
    NOTICE."""
    flt = [Filter.make(kinds=[1111], tags={"E": ["ab" * 32]})]
    clock = [connection.time.monotonic()]  # (the misbehaviour budget refills by the real clock)
    monkeypatch.setattr(connection.time, "monotonic", lambda: clock[0])
    session.subscribe("slow", flt)
    clock[0] += NOTICE_PREFIX_REFUSAL_SECS + 1
    session._handle_frame(frame("NOTICE", 'invalid: "#E" is not allowed'))
    assert _closed_posted(session) == []
    session.subscribe("upper", flt)
    session._handle_frame(frame("NOTICE", "we do not serve #E here"))
    assert _closed_posted(session) == []
    session._handle_frame(frame("NOTICE", 'invalid: "#E" is not allowed'))
    assert _closed_posted(session) == [("upper", '"#E" is not allowed')]
    assert _sent(session)[-1] == ["CLOSE", "upper"]
    # two sent together and waiting: whose? Neither is taken (the stall finds it)
    session.subscribe("first", flt)
    session.subscribe("second", flt)
    session._handle_frame(frame("NOTICE", 'invalid: "#E" is not allowed'))
    assert len(_closed_posted(session)) == 1


def test_refusing_notices_among_several_reqs_are_told_by_the_others_answers(session):
    """A burst of REQs, two refused by NOTICE alone (nostream: each holding ``#E``): while
    several wait, a NOTICE is nobody's; once the others are answered, those left are the
    refused ones, each taken as a CLOSED. One refused in a CLOSED too leaves the others
    alone."""
    flt = [Filter.make(kinds=[1111], tags={"E": ["ab" * 32]})]
    for sub_id in ("refused-1", "served", "refused-2", "slow"):
        session.subscribe(sub_id, flt)
    session._handle_frame(frame("NOTICE", 'invalid: "#E" is not allowed'))
    session._handle_frame(frame("NOTICE", 'invalid: "#E" is not allowed'))
    assert _closed_posted(session) == []
    session._handle_frame(frame("EOSE", "served"))
    assert _closed_posted(session) == []  # three left for two NOTICEs
    session._handle_frame(frame("EVENT", "slow", f.comment(f.Author.named("z"), f.issue(f.Author.named("z"), REPO)).to_dict()))
    assert sorted(_closed_posted(session)) == [("refused-1", '"#E" is not allowed'), ("refused-2", '"#E" is not allowed')]
    # a relay that says it twice: its CLOSED explains the NOTICE, the other REQ is not taken
    for sub_id in ("twice", "innocent"):
        session.subscribe(sub_id, flt)
    session._handle_frame(frame("NOTICE", "blocked: not here"))
    session._handle_frame(frame("CLOSED", "twice", "blocked: not here"))
    assert "innocent" in session.subscriptions and len(_closed_posted(session)) == 3


def test_a_notice_refusing_a_req_closed_before_its_answer_is_not_taken_for_one_sent_after(session):
    """A REQ closed before the relay answered it (a fresh start closes what runs) may still
    be refused in a NOTICE naming nothing: the relay reads in order, and that NOTICE comes
    before any answer to the REQs sent since. Taken for one of those, a REQ the relay served
    was closed and its shape paused (the simulator's seed 2140 of the stress world: ``#E``
    paused with ``#q``, which alone the relay refused). Until the relay answers a REQ sent
    after it, the closed one is among the NOTICE's candidates."""
    flt = [Filter.make(kinds=[1111], tags={"q": ["ab" * 32]})]
    session.subscribe("closed-early", flt)
    session.unsubscribe("closed-early")
    for sub_id in ("served-1", "refused", "served-2"):
        session.subscribe(sub_id, flt)
    session._handle_frame(frame("NOTICE", "blocked: #q queries are not allowed here"))  # closed-early's
    session._handle_frame(frame("EOSE", "served-1"))
    session._handle_frame(frame("NOTICE", "blocked: #q queries are not allowed here"))  # refused's
    assert _closed_posted(session) == []  # (served-2's answer is slow: two left for one NOTICE)
    session._handle_frame(frame("EOSE", "served-2"))
    assert _closed_posted(session) == [("refused", "#q queries are not allowed here")]
    assert "served-2" not in session.book.unanswered and not session.book.closed_unanswered
    # one closed unanswered and then answered by a REQ sent after it: no candidate any more
    session.subscribe("closed-again", flt)
    session.unsubscribe("closed-again")
    session.subscribe("later", flt)
    session._handle_frame(frame("EOSE", "later"))
    session.subscribe("last", flt)
    session._handle_frame(frame("NOTICE", "blocked: #q queries are not allowed here"))
    assert _closed_posted(session)[-1] == ("last", "#q queries are not allowed here")


def _keyed_with_reqs(*sub_ids: str) -> RelayConnection:
    """A session with a key and REQs sent, as at a connect: before the relay's challenge is read."""
    posted = []
    conn = keyed_session()
    conn._post = posted.append
    conn.posted = posted
    for sub_id in sub_ids:
        conn.subscribe(sub_id, [Filter.make(kinds=[1621], tags={"a": [REPO]})])
    return conn


def test_reqs_refused_for_auth_in_a_notice_alone_go_again_after_our_auth():
    """A NIP-42 relay that refuses what it read before our AUTH in a NOTICE ``auth-required:``
    alone (no CLOSED): a connect's REQs, sent before its challenge was read, were never
    answered, its live REQs dead for the session (seed 360 of the simulator's per-filter
    mix with NOTICE refusals). They go again after the AUTH, once, and the NOTICEs about
    them are nobody's refusal: a later refusal is told as before."""
    conn = _keyed_with_reqs("l1-live", "live-1", "h1")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    for _ in range(3):
        conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    out = _sent(conn)
    assert [(m[0], m[1] if m[0] == "REQ" else "") for m in out] == [
        ("REQ", "l1-live"), ("REQ", "live-1"), ("REQ", "h1"), ("AUTH", ""),
        ("REQ", "l1-live"), ("REQ", "live-1"), ("REQ", "h1")]
    assert _closed_posted(conn) == [] and set(conn.subscriptions) == {"l1-live", "live-1", "h1"}
    conn._handle_frame(frame("OK", conn._auth_event_id, True, ""))
    conn.subscribe("h2", [Filter.make(kinds=[1111], tags={"e": ["ab" * 32]})])
    for sub_id in ("l1-live", "live-1", "h1"):
        conn._handle_frame(frame("EOSE", sub_id))
    conn._handle_frame(frame("NOTICE", "blocked: #e queries are not allowed here"))
    assert _closed_posted(conn) == [("h2", "#e queries are not allowed here")]
    # a second refusal of one sent again is the relay's answer: a refusal, not a third REQ
    conn.subscribe("h3", [Filter.make(kinds=[1621], tags={"a": [REPO]})])
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert _closed_posted(conn)[-1] == ("h3", "authenticate first")
    assert [m[0] for m in _sent(conn)] == ["REQ", "CLOSE", "REQ", "CLOSE"]


def test_auth_notices_before_the_challenge_wait_for_our_auth():
    """A relay that challenges only once it has refused: its NOTICEs come first, and the
    REQs they refused go again right after our AUTH."""
    conn = _keyed_with_reqs("live-1", "h1")
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "REQ"] and _closed_posted(conn) == []
    conn._handle_frame(frame("AUTH", "challenge-1"))
    assert [(m[0], m[1] if m[0] == "REQ" else "") for m in _sent(conn)] == [
        ("AUTH", ""), ("REQ", "live-1"), ("REQ", "h1")]
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))  # (not ours to take)
    assert _closed_posted(conn) == []


def test_auth_notices_without_a_key_or_after_our_auth_was_refused_are_refusals(session):
    """Without a key, or once the relay refused our AUTH, an ``auth-required:`` NOTICE is the
    REQ's refusal (the manager pauses its coverage, as for an auth-required CLOSED), not a
    stall."""
    session.subscribe("h1", [Filter.make(kinds=[1621], tags={"a": [REPO]})])
    session._handle_frame(frame("AUTH", "challenge-1"))
    session._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert _closed_posted(session) == [("h1", "authenticate first")]
    conn = _keyed_with_reqs("h1")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    conn._handle_frame(frame("OK", conn._auth_event_id, False, "restricted: not a member"))
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "AUTH", "REQ", "CLOSE"]
    assert _closed_posted(conn) == [("h1", "authenticate first")]


def test_a_neg_open_refused_for_auth_in_a_notice_goes_again_after_our_auth():
    conn = keyed_session()
    inbox, opening = exchange_opened(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NOTICE", "auth-required: authenticate first"))
    assert [m[0] for m in _sent(conn)] == ["NEG-OPEN", "AUTH", "NEG-OPEN"]
    assert inbox.empty()  # the exchange waits for the answer to the one sent again


def test_reqs_read_before_our_auth_and_refused_restricted_go_again_after_it_once():
    """nostr_relay challenges at connect and answers each REQ it read before our AUTH with
    a NOTICE ``restricted: permission denied`` (NIP-42 would say ``auth-required:``). Those
    go again after the AUTH, once; what it served before is not asked again; and a
    ``restricted:`` refusal of the REQs sent again, or of a REQ sent after our AUTH, is
    final, as any."""
    conn = _keyed_with_reqs("l1-live", "live-1", "h1")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("EOSE", "l1-live"))  # (served: not sent again)
    conn._handle_frame(frame("NOTICE", "restricted: permission denied"))
    conn._handle_frame(frame("NOTICE", "restricted: permission denied"))
    assert [(m[0], m[1] if m[0] == "REQ" else "") for m in _sent(conn)] == [
        ("REQ", "l1-live"), ("REQ", "live-1"), ("REQ", "h1"), ("AUTH", ""),
        ("REQ", "live-1"), ("REQ", "h1")]
    assert _closed_posted(conn) == []
    conn._handle_frame(frame("EOSE", "live-1"))
    conn._handle_frame(frame("NOTICE", "restricted: permission denied"))  # (the key may not read)
    assert _closed_posted(conn) == [("h1", "permission denied")]
    conn.subscribe("h2", [Filter.make(kinds=[1111], tags={"e": ["ab" * 32]})])
    conn._handle_frame(frame("CLOSED", "h2", "restricted: permission denied"))
    assert _closed_posted(conn)[-1] == ("h2", "permission denied")
    assert [m[0] for m in _sent(conn)] == ["CLOSE", "REQ"]


def test_a_req_read_before_our_auth_and_closed_restricted_goes_again_after_it_once():
    conn = _keyed_with_reqs("h1")
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("CLOSED", "h1", "restricted: permission denied"))
    assert [m[0] for m in _sent(conn)] == ["REQ", "AUTH", "REQ"] and _closed_posted(conn) == []
    conn._handle_frame(frame("CLOSED", "h1", "restricted: permission denied"))
    assert _closed_posted(conn) == [("h1", "permission denied")] and _sent(conn) == []


@pytest.mark.parametrize("keyed", [True, False])
def test_restricted_before_any_challenge_or_without_a_key_is_a_refusal(keyed, session):
    """No challenge come yet (NIP-42 relays challenge at connect, or say ``auth-required:``),
    or no key to answer one: a ``restricted:`` refusal is final at once."""
    conn = _keyed_with_reqs("h1") if keyed else session
    if not keyed:
        conn.subscribe("h1", [Filter.make(kinds=[1621], tags={"a": [REPO]})])
        conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NOTICE", "restricted: permission denied"))
    assert _closed_posted(conn) == [("h1", "permission denied")]
    assert [m[0] for m in _sent(conn)] == ["REQ", "CLOSE"]


def test_a_neg_open_read_before_our_auth_and_refused_restricted_goes_again_after_it():
    conn, inbox, _ = exchange_sent_again_after_auth("restricted: permission denied")
    assert inbox.empty()
    conn._handle_frame(frame("NEG-ERR", "neg1-7", "restricted: permission denied"))
    assert inbox.qsize() == 1  # refused again: the exchange's answer


def test_a_notice_naming_a_req_that_it_refuses_is_that_reqs_closed_whatever_else_waits():
    """``["NOTICE", <sub_id>, <message>]`` (NIP-01's form for a while in 2023): a refusal
    naming a REQ of ours is its CLOSED, though several wait (no guess); auth-required so
    sends it again after our AUTH; one naming an exchange goes to that exchange alone, and
    one naming nothing of ours refuses nothing."""
    conn = _keyed_with_reqs("first", "second", "third")
    inbox, _ = exchange_opened(conn)
    other = Queue()
    conn.open_negentropy("neg1-8", other)
    conn._handle_frame(frame("NOTICE", "second", "blocked: not here"))
    assert _closed_posted(conn) == [("second", "not here")]
    assert inbox.empty() and other.empty()  # about a REQ: no exchange's refusal
    _sent(conn)
    conn._handle_frame(frame("AUTH", "challenge-1"))
    conn._handle_frame(frame("NOTICE", "third", "auth-required: authenticate first"))
    assert [(m[0], m[1] if m[0] == "REQ" else "") for m in _sent(conn)] == [("AUTH", ""), ("REQ", "third")]
    assert _closed_posted(conn) == [("second", "not here")]
    conn._handle_frame(frame("NOTICE", "neg1-7", "blocked: not here"))
    assert inbox.qsize() == 1 and other.empty()
    conn._handle_frame(frame("NOTICE", "somebody-else", "blocked: not here"))
    conn._handle_frame(frame("NOTICE", "first", "info: 3 events served"))
    assert _closed_posted(conn) == [("second", "not here")] and other.empty()
