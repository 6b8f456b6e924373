"""Which relays do not serve ids, and which ids are not there (``sync.unservable``): pure."""
from gsync.constants import IDS_NOT_SERVED_MIN_ADVERTISED
from gsync.sync.unservable import UnservableIds, ids_not_served


def test_one_id_served_neither_by_id_nor_by_its_filter_says_nothing_of_the_relay():
    assert not ids_not_served(advertised=1, served_by_id=0, brought_by_filter=0)
    assert not ids_not_served(advertised=1, served_by_id=0)  # its filter could not answer


def test_a_filter_that_brings_what_the_id_fetch_did_not_says_the_relay_does_not_serve_ids():
    assert ids_not_served(advertised=1, served_by_id=0, brought_by_filter=1)
    assert ids_not_served(advertised=5, served_by_id=0, brought_by_filter=1)


def test_where_the_filters_could_not_answer_twenty_advertised_and_a_tenth_served_judge():
    n = IDS_NOT_SERVED_MIN_ADVERTISED
    assert ids_not_served(advertised=n, served_by_id=n // 10)  # (brought_by_filter None)
    assert not ids_not_served(advertised=n - 1, served_by_id=0)
    assert not ids_not_served(advertised=n, served_by_id=n // 10 + 1)


def test_a_relay_that_served_a_page_of_ids_serves_ids_though_its_cap_cut_the_fetch():
    """Seed 8's year of small pages: 300 ids asked in one filter of a relay serving 20 a
    filter; the filters brought the rest. It serves ids: its NIP-77 stays on."""
    assert not ids_not_served(advertised=300, served_by_id=20, brought_by_filter=280)
    assert not ids_not_served(advertised=300, served_by_id=20)
    assert ids_not_served(advertised=300, served_by_id=2, brought_by_filter=298)


def test_many_ids_that_their_filters_did_not_bring_either_say_nothing_of_the_relay():
    n = IDS_NOT_SERVED_MIN_ADVERTISED
    assert not ids_not_served(advertised=n, served_by_id=0, brought_by_filter=0)
    assert not ids_not_served(advertised=10 * n, served_by_id=n, brought_by_filter=0)
    assert ids_not_served(advertised=n, served_by_id=0, brought_by_filter=1)


def test_a_relay_that_served_more_than_a_tenth_by_id_serves_ids_whatever_its_filters_bring():
    assert not ids_not_served(advertised=10, served_by_id=2, brought_by_filter=8)


def test_unservable_ids_are_counted_once_bounded_and_cleared():
    memory = UnservableIds(max_ids=3)
    assert memory.add(["a", "b", "a"]) == ["a", "b"]
    assert memory.add(["b", "c"]) == ["c"]
    assert "a" in memory and len(memory) == 3
    memory.add(["d"])
    assert len(memory) == 3 and "a" not in memory and "d" in memory  # the oldest goes first
    memory.clear()
    assert len(memory) == 0 and "d" not in memory


def test_what_was_unservable_before_the_last_daily_clear_is_remembered_until_the_next():
    memory = UnservableIds()
    memory.add(["a"])
    assert memory.before("a") and not memory.before("b")
    memory.clear()
    assert "a" not in memory and memory.before("a")
    memory.add(["b"])
    memory.clear()
    assert not memory.before("a") and memory.before("b")


def test_an_id_unservable_the_day_before_is_asked_by_id_once_a_day():
    memory = UnservableIds()
    memory.add(["a"])
    memory.clear()  # the daily fresh start
    memory.asked_by_id(["a", "new"])
    assert memory.asked_today("a") and not memory.asked_today("new"), "only what was unservable before"
    memory.clear()  # the next daily: asked again, once ("a" was asked and not judged since)
    assert not memory.asked_today("a") and memory.before("a") and not memory.before("new")
    memory.clear()  # not asked since: forgotten
    assert not memory.before("a")


def test_an_id_asked_by_id_and_not_served_is_not_lag_at_the_next_daily_fresh_start():
    """Seed 64 of --fault-scale 3 with --notice-refusals 0.3: on a relay ignoring ``until``
    its filter is no witness, so a hidden id is never judged unservable; taken for lag at
    each daily fresh start, it was asked by id, again, and by recovery each day (9 times in
    23.7 h). Asked and not served, it is not lag the next day: asked by id once."""
    memory = UnservableIds()
    memory.asked_by_id(["hidden"], unserved=True)
    assert memory.asked_today("hidden") and not memory.before("hidden")
    memory.clear()
    assert memory.before("hidden") and not memory.asked_today("hidden")
