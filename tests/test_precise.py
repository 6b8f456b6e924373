"""Relays answering only precise queries (nostr-rs-relay's ``limit_scrapers``): the score,
the filters as such a relay is asked them, the probe, and the REQs a book writes for one."""
import json

from gsync.protocol import precise
from gsync.protocol.event import Event
from gsync.protocol.filters import Filter
from gsync.protocol.nip11 import parse_nip11
from gsync.protocol.subscription_book import SubscriptionBook

OWNER = "ab" * 32
ADDR = f"30617:{OWNER}:r"


def test_filters_score_as_nostr_rs_relay_scores_them():
    assert precise.precision(Filter.make(kinds=[30617])) == 1
    assert precise.precision(Filter.make(tags={"a": [ADDR]})) == 1
    assert precise.precision(Filter.make(tags={"e": ["cd" * 32], "E": ["cd" * 32]})) == 1  # (tags count once)
    assert precise.precision(Filter.make(kinds=[30618], tags={"d": ["r"]})) == 2
    assert precise.precision(Filter.make(ids=["cd" * 32])) == 2
    assert precise.precision(Filter.make(kinds=[30617], authors=[OWNER])) == 2
    assert precise.is_imprecise(Filter.make(limit=10))


def test_imprecise_filters_are_made_precise_and_precise_ones_left_as_they_are():
    tagged = Filter.make(tags={"a": [ADDR]}, since=5, limit=500)
    made = precise.made_precise(tagged, frozenset({OWNER}))
    assert made.kinds == precise.PRECISE_KINDS and made.tags == tagged.tags and (made.since, made.limit) == (5, 500)
    layer1 = Filter.make(kinds=[30617, 10317], limit=0)
    assert precise.made_precise(layer1, frozenset({OWNER})).authors == frozenset({OWNER})
    assert precise.made_precise(layer1, frozenset()) == layer1  # (no author known: as it is)
    state = Filter.make(kinds=[30618], tags={"d": ["r"]})
    assert precise.made_precise(state, frozenset({OWNER})) is state
    assert all(not precise.is_imprecise(precise.made_precise(f, frozenset({OWNER}))) for f in (tagged, layer1))


def probe(trigger, authors):
    """The probe's filters (``precise.probe_sources``, without what each was made from)."""
    return [made for _, made in precise.probe_sources(trigger, authors)]


def test_the_probe_asks_the_empty_reqs_imprecise_filters_precisely_a_few_events_each():
    """What the probe asks is what the REQ that came back empty asked, made precise, within
    the same bounds: anything it brings that REQ asked for."""
    layer1 = Filter.make(kinds=[10317, 30617], since=100)
    tagged = Filter.make(tags={"a": ["30617:" + OWNER + ":r"]}, until=900)
    by_kinds, by_tag = probe([layer1, tagged], {OWNER, "ef" * 32})
    assert by_kinds == layer1.replace(authors=frozenset({OWNER, "ef" * 32}), limit=precise.PROBE_LIMIT)
    assert by_tag == tagged.replace(kinds=precise.PRECISE_KINDS, limit=precise.PROBE_LIMIT)
    assert not any(precise.is_imprecise(f) for f in (by_kinds, by_tag))
    [many] = probe([layer1], (f"{n:064x}" for n in range(500)))
    assert len(many.authors) == precise.PROBE_AUTHORS
    assert probe([layer1], ()) == []  # (no owner known: it stays imprecise, left out)
    assert probe([tagged], ()) == [by_tag]


def test_only_the_software_known_to_limit_is_probed():
    doc = '{"software": "https://git.sr.ht/~gheartsfield/nostr-rs-relay", "version": "0.9.0"}'
    assert precise.may_limit(parse_nip11(doc).software)
    assert not precise.may_limit(parse_nip11('{"software": "git+https://github.com/hoytech/strfry.git"}').software)
    assert parse_nip11('{"software": 7}').software == "" and parse_nip11(None).software == ""
    assert len(parse_nip11(json.dumps({"software": "x" * 5000})).software) == 200


def test_a_book_for_such_a_relay_writes_its_reqs_precise_and_matches_against_what_it_sent():
    book = SubscriptionBook(clock=lambda: 0.0)
    book.precise_authors = frozenset({OWNER})
    text = book.req_frame("h1", [Filter.make(tags={"a": [ADDR]}, limit=500), Filter.make(kinds=[30617], limit=500)])
    tagged, layer1 = json.loads(text)[2:]
    assert sorted(tagged["kinds"]) == sorted(precise.PRECISE_KINDS) and tagged["#a"] == [ADDR]
    assert layer1["authors"] == [OWNER] and layer1["kinds"] == [30617]
    sent = book.subscriptions["h1"].filters
    assert all(not precise.is_imprecise(f) for f in sent)
    plain = SubscriptionBook(clock=lambda: 0.0)
    assert json.loads(plain.req_frame("h1", [Filter.make(tags={"a": [ADDR]})])) == ["REQ", "h1", {"#a": [ADDR]}]


def anti_sync_bots_refuses(f: Filter) -> bool:
    """khatru's ``AntiSyncBots``: no authors, and no kinds or kind 1 among them."""
    return f.authors is None and (f.kinds is None or 1 in f.kinds)


def test_a_relay_refusing_filters_that_may_bring_notes_is_probed_and_asked_without_them():
    tag, ids = Filter.make(tags={"a": ["30617:p:d"]}), Filter.make(ids=["ab" * 32])
    layer1, state = Filter.make(kinds=[30617, 10317]), Filter.make(kinds=[30618], authors=["p"], tags={"d": ["d"]})
    made = [precise.made_precise(f, frozenset(), precise.NOTES_EXCLUDED, ids_too=True)
            for f in (tag, ids, layer1, state)]
    assert made[2:] == [layer1, state]  # not refused: as they were
    assert made[0].kinds == made[1].kinds == precise.NOTES_EXCLUDED and made[1].ids == ids.ids
    assert not any(anti_sync_bots_refuses(f) for f in made)
    assert [precise.kinds_probe(f) for f in (tag, ids)] == made[:2]
    assert precise.NOTES_EXCLUDED == precise.PRECISE_KINDS - {1}
    # (nostr-rs-relay's precision: an ids filter scores 2 already, left as it is)
    assert precise.made_precise(ids, frozenset({"p"})) == ids


def test_what_a_refusal_about_kinds_may_be_about():
    assert precise.may_be_refused_for_kinds(Filter.make(tags={"e": ["x"]}))
    assert precise.may_be_refused_for_kinds(Filter.make(ids=["ab" * 32]))  # an id fetch too
    assert precise.may_be_refused_for_kinds(Filter.make(tags={"e": ["x"]}, kinds=[1, 1111]))
    assert not precise.may_be_refused_for_kinds(Filter.make(kinds=[30617]))  # no tags: not ours to fix
    assert not precise.may_be_refused_for_kinds(Filter.make(tags={"e": ["x"]}, kinds=[1111]))
    assert not precise.may_be_refused_for_kinds(Filter.make(tags={"d": ["x"]}, authors=["p"]))
    assert not precise.may_be_refused_for_kinds(precise.kinds_probe(Filter.make(tags={"e": ["x"]})))


def test_a_probe_asks_one_filter_at_a_time_in_turn():
    """A relay answering one filter of a REQ dropped one of the two (``probe_turn``)."""
    both = probe([Filter.make(kinds=[30617]), Filter.make(tags={"e": ["cd" * 32]})], {OWNER})
    assert [precise.probe_turn(both, turn) for turn in range(3)] == [both[:1], both[1:], both[:1]]
    assert precise.probe_turn(probe([], {OWNER}), 0) == []


def test_a_probes_event_proves_only_what_the_empty_req_asked_a_second_inside_its_bounds():
    repo = "30617:" + OWNER + ":r"
    trigger = [Filter.make(tags={"a": [repo]}, since=100, until=200)]

    def event(at, tagged=repo):
        return Event(id="ab" * 32, pubkey="cd" * 32, created_at=at, kind=1621, tags=(("a", tagged),),
                     content="", sig="")

    assert precise.proves_ignored(trigger, event(150))
    assert not precise.proves_ignored(trigger, event(200))  # at until's second: exclusive readers never send it
    assert not precise.proves_ignored(trigger, event(100))  # ... nor since's
    assert not precise.proves_ignored(trigger, event(150, "30617:" + OWNER + ":other"))  # not asked
    assert not precise.proves_ignored([], event(150))
