"""The deterministic simulator (gsync/sim): gsync's real manager through simulated weeks of
a seeded world with faults, every invariant checked as it runs; a seed replays the same run;
the relay model answers as LocalRelay does."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import random
import subprocess
import sys
import types

import pytest
import websocket

from gsync import constants
from gsync.io import negentropy_ws
from gsync.io.inbox import DeliveryAnswered, RemoteEvent, RemoteEvents
from gsync.ops import metrics
from gsync.protocol.filters import Filter
from gsync.protocol.precise import NOTES_EXCLUDED
from gsync.sim import SimOptions, Simulation, run
from gsync.sim.invariants import BUSY_BASE, BUSY_PER_ACTION, BUSY_PER_LOST
from gsync.sim.relay import EventStore, SimRelay, filter_from_json
from gsync.sim.world import START, World
from gsync.sync.own_witness import OwnWitness
from gsync.sync.relay_state import ConnectionStatus

from .factory import Author, announcement, comment, issue, repo_addr, state
from .manager_harness import ManagerHarness
from .relays import write_seed_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small world, quick enough for the suite: 3 relays, 8 repositories, ticks every 5 minutes
# while nothing happens (sim.Simulation.tick).
# (no imports: in a world of 8 repositories one import of 100-400 events makes a run half as
# long again, and the suite's seeds of 30 days stay within its time; bench/simulate's
# default world has them, and tests/test_pending.py the relay they found events lost on;
# nor relays closing every subscription after its EOSE: one of three polled every 5 minutes
# for 30 days made the suite's seeds two and a half times the CPU; their own short world below)
SMALL = dict(relays=3, repos=8, idle_tick_secs=300, imports=0, closes_after_eose=0)

# The world the seeds replayed below were found in, before 2026-12-05 grew it (relays reading
# until as exclusive, capping a whole REQ, reading limit 0 as none, closing after EOSE,
# limiting queries; imports; the own relay full, read-only, limiting writes; and, later,
# relays ignoring until): each draws from a generator of its own, so with all of them 0 a
# seed's world is the one it was.
OLDER_WORLD = dict(until_exclusive=0, req_caps=0, limit_zero=0, imports=0, own_full=0, own_readonly=0,
                   own_rate_limited=0, closes_after_eose=0, query_limits=0, ignores_until=0)


def test_the_same_seed_gives_the_same_trace_hash_and_another_seed_another():
    a = run(seed=7, days=1, **SMALL)
    b = run(seed=7, days=1, **SMALL)
    c = run(seed=8, days=1, **SMALL)
    assert a.trace_hash == b.trace_hash
    assert a.messages == b.messages and a.messages > 300
    assert c.trace_hash != a.trace_hash


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_a_seed_replays_the_same_run_in_another_process():
    """bench/simulate runs under PYTHONHASHSEED=0: gsync iterates sets of relay URLs, so the
    order of its per-relay actions follows str hashing, fixed then in every process."""
    code = ("from gsync.sim import run; "
            "print(run(seed=3, days=1, relays=3, repos=8, idle_tick_secs=300).trace_hash)")
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=ROOT)
    hashes = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True, timeout=120).stdout.strip() for _ in range(2)]
    assert hashes[0] == hashes[1] and len(hashes[0]) == 64


def test_bench_simulate_reports_a_seed_whose_run_raised_and_goes_on(monkeypatch):
    """A run that raises (the background run's seed 67 or 68: a dial after a kill) is that
    seed's failure with its replay command, not the end of a thousand-seed run."""
    loader = importlib.machinery.SourceFileLoader("bench_simulate", os.path.join(ROOT, "bench", "simulate"))
    script = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(script)

    def raises(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(Simulation, "run", raises)
    args = script.parser().parse_args(["--days", "0.01", "--relays", "3", "--repos", "8"])
    seed, result, _, _ = script._run(args, 5)
    [(day, text, detail)] = result.violations["simulator_raised"]
    assert seed == 5 and day == 0.0 and text == "RuntimeError: boom" and "raises" in detail
    assert "--seed 5 " in result.replay_command()


# Found by the simulator and not fixed yet, so checked apart while the seeds guard every
# other invariant (none now).
KNOWN: tuple[str, ...] = ()


def _assert_clean(result, known=KNOWN):
    broken = {name: kept[:3] for name, kept in result.violations.items() if name not in known}
    assert not broken, f"{broken}\nreplay: {result.replay_command()}"


class Ran:
    """What a simulation run in a child process reported (``run_replayable``)."""

    def __init__(self, report: dict):
        self.violations = report["violations"]
        self.summary = report["summary"]
        self.trace_hash = report["trace_hash"]
        self._replay = report["replay"]

    def replay_command(self) -> str:
        return self._replay


def run_replayable(**options) -> Ran:
    """A simulation in a child process under PYTHONHASHSEED=0, as bench/simulate runs it (gsync
    iterates sets of relay URLs): a seed pinned here is the run its replay command shows."""
    return run_replayable_seeds([options["seed"]], **{k: v for k, v in options.items() if k != "seed"})[0]


def run_replayable_seeds(seeds, **options) -> list[Ran]:
    """``run_replayable`` for several seeds, one after another in one child process (the
    import is paid once)."""
    code = ("import json, sys; from gsync.sim import run\n"
            "for seed in json.loads(sys.argv[2]):\n"
            "    r = run(seed=seed, **json.loads(sys.argv[1]))\n"
            "    print(json.dumps({'violations': {k: v[:3] for k, v in r.violations.items()}, "
            "'summary': r.summary, 'trace_hash': r.trace_hash, 'replay': r.replay_command()}))")
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(options), json.dumps(list(seeds))], env=env,
                         capture_output=True, text=True, check=True, timeout=900).stdout
    return [Ran(json.loads(line)) for line in out.strip().splitlines()[-len(seeds):]]


# Eight seeds x 30 days in two child processes of four seeds (twenty until 2026-12-05, sixteen
# until 2026-12-07). Sixteen had grown to 123 s of the suite's 344 s of CPU (each test's own
# and its children's, the per-test measure in bench/README's "first session of 2026-12-07"):
# the suite took 248 s where it should take 150. Seeds 5-8 and 13-16 go on in the sweep run
# before a merge, with the others:
#     bench/simulate --seeds 16 --days 30 --relays 3 --repos 8 --idle-tick 300 --imports 0 --closes-after-eose 0 --jobs 2
# and bench/simulate --seeds 100 ... in the background.
# Among them: seed 9 found a relay restarting every few minutes after an outage dialled once
# an hour (fixed in sync.health: a session that served for a minute starts the streak again
# from one; the seed fails with the fix reverted). Seeds 1, 4 and 15 showed, before the
# method-choice and Effects merges, an id advertised and never served asked by id every 10-15
# minutes (unservable_asked_again); they no longer do, which change ended it is not known,
# and seeds 1 and 4 keep watching. Seed 2 of 6 relays, 20 repositories and 10 days (refused coverage
# asked again after a consolidation) and seed 1 of the same (refusals unreleased after the own
# relay restarted empty) are pinned below.
SUITE_SEEDS = (*range(1, 5), *range(9, 13))
GROUP = 4


@pytest.mark.slow  # 27-35 s of CPU each (2026-12-07): the suite runs them (first), the quick loop does not
@pytest.mark.long
@pytest.mark.parametrize("first", SUITE_SEEDS[::GROUP])
def test_thirty_days_with_faults_break_no_invariant(first):
    for result in run_replayable_seeds(range(first, first + GROUP), days=30, **SMALL):
        _assert_clean(result)
        assert result.summary["liveness_checks"] >= 24  # the liveness day came, and was checked
        assert sum(result.summary["faults"].values()) > 100


@pytest.mark.slow
def test_relays_that_close_every_subscription_after_its_eose_are_polled_without_a_busy_loop():
    """Every relay closes each subscription after its EOSE, live ones too (PEERS.md): gsync
    polls them, every 5 minutes at most (``LIVE_NOT_KEPT_POLL_SECS``), and what they get
    reaches the own relay. Without the mark (mutant k) this world is a ``busy_loop``."""
    result = run(seed=1, days=4, liveness_after=2, **dict(SMALL, closes_after_eose=1))
    _assert_clean(result)
    assert result.summary["liveness_checks"] >= 24


@pytest.mark.slow
def test_a_relay_wanted_only_at_the_end_of_a_window_is_not_judged_neglected_for_it():
    """Seeds 4 and 40 (found as neglected_relay, the checker's own mistake): relay2 is listed
    only by announcements the own relay lost (it came back empty); gsync drops it from its
    table, as it should, until its fresh start from a bootstrap relay delivers them again
    (seed 4: day 15.999) or a new announcement lists it (seed 40: day 7.302), and dials it
    within seconds. The invariant judged the whole 4 h window by whether relay2 was wanted at
    its end; it now counts a relay's up time only while it is wanted. (Seed 4 is among
    SUITE_SEEDS.)"""
    _assert_clean(run_replayable(seed=40, days=30, abandon_per_day=0, **dict(SMALL, **OLDER_WORLD)))


def _forget_confirmed(sim) -> None:
    """gsync's saved state keeps what each relay learnt and the roots it confirmed, not which
    repositories nor what the own relay stored: a restart then sees nothing the own relay lost
    (``lifecycle.look_for_lost``, ``sync.own_witness``), as before it looked (a relay with
    roots confirmed still reconnects quickly)."""
    import sqlite3

    from gsync.io.manager.saved_state import WITNESSES
    from gsync.sync.memory import ROOT_LEVEL
    db = sqlite3.connect(os.path.join(sim.state_dir, "gsync.db"))
    with db:
        db.execute("DELETE FROM confirmed WHERE level != ?", (ROOT_LEVEL,))
        db.execute("DELETE FROM meta WHERE key = ?", (WITNESSES,))
    db.close()


def test_the_relays_a_process_asks_what_the_own_relay_lost_are_excused_a_day_from_its_first_read():
    """Seed 130 of the stress mix (relay_table, day 10.96; the checker's mistake): gsync,
    started with the own relay away, read it 1.5 h later and only then asked the relays that
    had confirmed what it lost (``lifecycle.look_for_lost``: a day from that read). The
    checker excused them a day from the process's start, and judged the last 1.5 h. It counts
    from the process's first read of the own relay now."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, **SMALL))
    reads = []
    start, stop = START + 0.1 * 86_400, START + 0.1 * 86_400 - 60

    def note_read():
        reads.append((sim.clock.now, sim.checker.first_read_at))

    sim.at(stop, sim.stop_gsync, True)
    sim.at(stop + 1, sim.own_away, 5400.0)  # away when gsync starts, back 1.5 h later
    sim.at(start, sim.start_gsync)
    sim.at(start + 3600, note_read)
    sim.at(start + 5400 + 600, note_read)
    sim.at(start + 5400 + 1800, sim.own_away, 60.0)  # a later read does not move it
    sim.at(start + 5400 + 3600, note_read)
    _assert_clean(sim.run())
    (_, before), (_, first), (_, after) = reads
    assert before < start  # not read yet in this process
    back = stop + 1 + 5400
    assert back <= first < back + 60  # read once the own relay was back
    assert after == first


def test_a_relay_is_judged_for_neglect_only_for_the_time_it_was_wanted():
    """The in-process form of seeds 4 and 40: the own relay comes back empty while gsync is
    stopped, and gsync, started again (knowing nothing it confirmed: no relay to ask what the
    own relay lost; its relays back within minutes, reconnecting quickly) keeps only its
    bootstrap relays; hours later the announcements listing relay2 reach the own relay again,
    five minutes before a neglect check: gsync dials relay2 at once, and the check judges only
    those minutes (it judged the whole window). (Running, gsync finds the loss itself:
    ``sync.own_witness``.)"""
    sim = Simulation(SimOptions(seed=4, days=0.55, faults=False, **SMALL))
    relay2 = sim.world.relay_urls[2]
    sim.at(START + 0.1 * 86_400 - 1, sim.stop_gsync, True)
    sim.at(START + 0.1 * 86_400, sim.own_away, 60.0, float("inf"))

    def start_forgetting_confirmed():
        _forget_confirmed(sim)
        sim.start_gsync()

    sim.at(START + 0.1 * 86_400 + 300, start_forgetting_confirmed)  # (its relays reconnect quickly)
    back = START + 0.5 * 86_400 - 300  # a neglect check every 4 h: this one at day 0.5

    def announce_again():
        assert relay2 not in sim.manager.relays and relay2 not in sim.checker.wanted_relays()[0]
        for repo in sim.world.repos:
            if relay2 in repo.relays:
                sim.publish(repo.announcement, [], own=True)

    sim.at(back, announce_again)
    _assert_clean(sim.run())
    assert any(t > back for t in sim.checker.dials[relay2])


def test_a_gsync_restarted_after_the_own_relay_emptied_asks_the_relays_it_remembers_for_what_it_lost():
    """The same world, and gsync remembers what the relays confirmed: started again after
    the own relay came back empty, it dials the relays that gave it the repositories the own
    relay no longer shows, whose layer 1 brings their announcements back (then their
    history); before, they waited for someone to publish again (the test above)."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    relay2 = sim.world.relay_urls[2]
    restart = START + 0.15 * 86_400
    held = set()
    sim.at(START + 0.1 * 86_400 - 1, lambda: held.update(sim.own.accepted))
    sim.at(START + 0.1 * 86_400, sim.own_away, 60.0, float("inf"))
    sim.at(restart, sim.stop_gsync, True)
    sim.at(restart + 10, sim.start_gsync)
    _assert_clean(sim.run())
    assert any(restart < t < restart + 600 for t in sim.checker.dials[relay2])
    assert any(relay2 in repo.relays and repo.address in held for repo in sim.world.repos)
    assert held and held <= set(sim.own.accepted), held - set(sim.own.accepted)


@pytest.mark.slow
def test_an_id_never_served_is_not_asked_by_id_again_and_again():
    """Seed 33: an id relay0 advertises and never serves, with others it serves by id, was
    asked of it by id four times in 23.6 h: at each of two daily fresh starts by its id fetch
    and by the residual's retry (for lag). Unservable there the day before, it is asked once
    by id at the next fresh start, then by its filter (``UnservableIds.before``; in process:
    test_unservable_decisions)."""
    _assert_clean(run_replayable(seed=33, days=30, abandon_per_day=0, **dict(SMALL, **OLDER_WORLD)))


def test_an_id_asked_of_a_relay_that_sends_no_eose_is_not_judged_asked_again():
    """Seed 4's year (unservable_asked_again, day 286.37; the checker's mistake): relay0 hid
    five ids and sent no EOSE to historic REQs (the no_eose fault); gsync's id fetch at its
    daily fresh start stalled, and recovery asked again on its schedule. A REQ without EOSE
    was not answered: its retries are not asks of an id the relay said it does not serve."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    url = sim.world.relay_urls[0]
    relay = sim.relays[url]
    relay.hidden = {"ab" * 32}
    counts = []

    def asked(no_eose, times):
        relay.no_eose = no_eose
        for i in range(times):
            conn = types.SimpleNamespace(relay=url, number=i, starts=[])
            sim.checker.client_frame(conn, "REQ", json.dumps(["REQ", f"x{no_eose}{i}", {"ids": ["ab" * 32]}]))
        relay.no_eose = False
        counts.append(dict(sim.checker.counts))

    sim.at(START + 0.1 * 86_400, asked, True, 5)
    sim.at(START + 0.1 * 86_400 + 60, asked, False, 4)
    sim.run()
    assert counts == [{}, {"unservable_asked_again": 1}]


def test_an_id_fetch_the_relay_closed_unanswered_and_sent_again_is_one_ask():
    """Seed 77's year (unservable_asked_again, day 306.01; the checker's mistake): relay1 found
    15 ids unservable at its daily fresh start and recovery asked relay3 for them by id, once;
    relay3 closed the REQ "rate-limited: slow down", and gsync sent it again after each 65 s
    cooldown, three times, each counted as a new ask. A REQ the relay closed unanswered is not
    an ask of an id it said it does not serve: sent again, it is the same ask. Asks answered
    still count."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    url = sim.world.relay_urls[0]
    sim.relays[url].hidden = {"ab" * 32}
    counts = []

    def ask(sub_id, *answer):
        conn = types.SimpleNamespace(relay=url, number=len(sub_id) * 100 + sum(map(ord, sub_id)), starts=[])
        sim.checker.client_frame(conn, "REQ", json.dumps(["REQ", sub_id, {"ids": ["ab" * 32]}]))
        sim.checker.relay_frame(conn, json.dumps([answer[0], sub_id, *answer[1:]]))

    def asked():
        ask("first", "EOSE")
        for i in range(4):  # recovery's fetch, rate-limited, sent again a cooldown apart
            ask(f"again{i}", "CLOSED", "rate-limited: slow down")
        ask("answered", "EOSE")
        counts.append(dict(sim.checker.counts))
        ask("third", "EOSE")
        ask("fourth", "EOSE")  # four answered asks within the day: one too many
        counts.append(dict(sim.checker.counts))

    sim.at(START + 0.1 * 86_400, asked)
    sim.run()
    assert counts == [{}, {"unservable_asked_again": 1}], counts


def test_an_id_beyond_where_a_cut_id_page_ends_is_not_asked():
    """Seed 22 of ``--relays 10 --repos 60 --small-pages 0.4`` (unservable_asked_again, day
    7.04; the checker's mistake): a relay serving 20 a filter was asked ids in filters of 47
    and 37 and sent 20 of each, newest first; the hidden id, older than all it sent, was
    counted as asked by each of those REQs and by the one asking the rest. An answer cut
    before an id's place says nothing of it; an answer that reaches it does."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    url = sim.world.relay_urls[0]
    counts = []

    def ask(sub_id, ids):
        conn = types.SimpleNamespace(relay=url, number=len(sub_id) * 100 + sum(map(ord, sub_id)), starts=[])
        sim.checker.client_frame(conn, "REQ", json.dumps(["REQ", sub_id, {"ids": sorted(ids)}]))
        sim.checker.relay_frame(conn, json.dumps(["EOSE", sub_id]))

    def asked():
        relay = sim.relays[url]
        seconds = {e.created_at: e for e in relay.store.events.values()}  # (one event a second)
        page = [seconds[at].id for at in sorted(seconds, reverse=True)[:22]]
        assert len(page) == 22
        oldest = page[-1]
        relay.hidden, relay.page_cap = {oldest}, 20
        for i in range(4):  # each cut at 20, before the hidden id's place
            ask(f"cut{i}", page)
        counts.append(dict(sim.checker.counts))
        for i in range(4):  # alone: each answer reaches it
            ask(f"alone{i}", [oldest])
        counts.append(dict(sim.checker.counts))

    sim.at(START + 0.1 * 86_400, asked)
    sim.run()
    assert counts == [{}, {"unservable_asked_again": 1}], counts


def test_a_relay_judged_not_to_serve_ids_by_the_seed_s_count_is_no_wrong_judgement_to_the_checker():
    """Seed 769 of the stress mix (ids_judged_unserved, day 19.29; the checker's mistake):
    relay1, ignoring until, hid 23 of the 24 ids its NIP-77 advertised; their filters came
    back unpaged (no witness), and gsync judged by the seed's count (at least 20 advertised,
    at most a tenth served), as the issue asks. A judgement after asks of which more than a
    tenth were served is still one."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    counts = []

    def judged(hidden_count):
        url = next(u for u in sim.manager.relays if sim.relays[u].up)
        ids = [f"{i:064x}" for i in range(24)]
        sim.relays[url].hidden = set(ids[:hidden_count])
        conn = types.SimpleNamespace(relay=url, number=hidden_count, starts=[])
        sim.checker.client_frame(conn, "REQ", json.dumps(["REQ", f"ids{hidden_count}", {"ids": ids}]))
        sim.manager.relays[url].ids_unserved_at = sim.clock.now
        sim.checker.ids_judgements()
        counts.append(dict(sim.checker.counts))

    sim.at(START + 0.1 * 86_400, judged, 23)
    sim.at(START + 0.1 * 86_400 + 60, judged, 20)  # 4 of 24 served: it serves ids
    sim.run()
    assert counts == [{}, {"ids_judged_unserved": 1}], counts


def test_an_id_asked_of_a_relay_retired_and_listed_again_is_counted_from_its_return():
    """Seed 52's year (unservable_asked_again, day 98.91; the checker's mistake): relay4's
    hidden id was asked by id twice at its daily fresh start; every repository dropped
    relay4, gsync retired it (what it marked unservable there with it: tables follow the
    work, SPEC §8), and when it was listed again 9 hours later asked it twice more, counted
    with the asks before it left. Asks count from the relay's return, as refusals do."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, publish_per_day=0.001, **SMALL))
    url = sim.world.relay_urls[2]
    relay = sim.relays[url]
    relay.hidden = {"ab" * 32}
    sim.faults.abandon_rng = random.Random(1)
    listing, states, counts = [], [], []

    def asked(times):
        states.append(sim.manager.relays.get(url))
        for i in range(times):
            conn = types.SimpleNamespace(relay=url, number=len(counts) * 10 + i, starts=[])
            sim.checker.client_frame(conn, "REQ", json.dumps(["REQ", f"x{len(counts)}{i}", {"ids": ["ab" * 32]}]))
        counts.append(dict(sim.checker.counts))

    def abandoned():
        listing.extend(repo for repo in sim.world.repos if url in repo.relays)
        sim.faults.abandon()  # (relay2 the only relay listed that is not a bootstrap one)

    def listed_again():
        assert url not in sim.manager.relays  # retired
        for repo in listing:
            repo.relays.append(url)
            sim.publish(sim.world.announce(repo, int(sim.clock.now)), list(repo.relays), own=True)

    sim.at(START + 0.1 * 86_400, asked, 2)
    sim.at(START + 0.12 * 86_400, abandoned)
    sim.at(START + 0.2 * 86_400, listed_again)
    sim.at(START + 0.25 * 86_400, asked, 2)
    sim.at(START + 0.26 * 86_400, asked, 2)  # four since its return: one too many
    sim.run()
    assert listing and states[0] is not None and states[1] is not None and states[1] is not states[0]
    assert counts == [{}, {}, {"unservable_asked_again": 1}], counts


def test_a_dial_requested_just_before_gsync_is_killed_is_dropped_with_it():
    """Seed 67 or 68's year (the background run; the simulator's mistake): gsync was killed
    within 10 ms of asking for a handshake, and the simulated handshake then ran with no
    manager, raising out of the run. What a stopped process asked for goes with it."""
    sim = Simulation(SimOptions(seed=4, days=0.05, faults=False, **SMALL))
    url = sim.world.relay_urls[0]

    def dial_then_kill():
        sim.manager.handshakes.request(url, 99)
        sim.stop_gsync(False)
        sim.at(sim.clock.now + 5, sim.start_gsync)

    sim.at(START + 0.02 * 86_400, dial_then_kill)
    _assert_clean(sim.run())  # (it raised out of the run before)
    assert sim.restarts == 2  # the kill, and the stop at the end of every run


def test_a_graceful_stop_saves_gsync_state():
    """Seed 10's year (dead_dialled, day 292.15; the simulator's mistake): gsync stopped
    gracefully 104 s after a dead relay's daily attempt and, started again, dialled it at
    once: the simulation's stop raised before its save (the manager's ticker, which ``stop``
    kills, was never started) and the error was swallowed, so every graceful stop was a kill.
    A graceful stop saves the state, and raises nothing."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    stopped = {}

    def stop_and_start():
        m = sim.manager
        sim.stop_gsync(graceful=True)
        stopped.update(at=sim.clock.now, saved_at=m.saved.saved_at)
        sim.start_gsync()

    sim.at(START + 0.1 * 86_400 + 7, stop_and_start)  # (between two saves of the tick)
    result = sim.run()
    assert stopped["saved_at"] == stopped["at"]
    _assert_clean(result)


def test_an_unrequested_event_is_judged_on_the_subscription_it_came_on_not_a_later_one_of_that_id():
    """Seed 10's year (unrequested_accepted, day 317.33; the checker's mistake): a junk answer
    to REQ h79-95 on day 138 carried an event matching none of its filters; 179 days and
    many restarts later another process's h79-95 asked for it, and gsync took it. The
    checker keyed what was sent unasked by sub id alone: it is the subscription of one
    session of one process."""
    sim = Simulation(SimOptions(seed=4, days=0.1, faults=False, **SMALL))
    sim.seed_world()
    url = sim.world.relay_urls[0]
    relay = sim.relays[url]
    asked = next(iter(relay.store.events.values()))
    sim.faults.junk_until[url] = float("inf")
    conn = types.SimpleNamespace(relay=url, gen=sim.gen, session=7, number=1)
    frames = ['["EVENT","h79-95",' + asked.to_json() + "]", '["EOSE","h79-95"]']
    sim.faults.tamper(relay, conn, json.dumps(["REQ", "h79-95", {"ids": [asked.id]}]), frames)
    (unasked,) = [sim.world.events[key[-1]] for key in sim.checker.unrequested]

    def taken(session):
        sim.checker.message(RemoteEvents(url, session, [RemoteEvent(url, session, "h79-95", unasked)]))
        return sim.checker.counts.get("unrequested_accepted", 0)

    assert taken(session=8) == 0, "a later session's h79-95, which may ask for it"
    assert taken(session=7) == 1, "taken from the subscription it came on unasked"


def _dead_relay_world(days: float):
    """A quiet world (no faults) where a bootstrap relay dies for good on day 0.1."""
    sim = Simulation(SimOptions(seed=4, days=days, relays=3, repos=8, faults=False, idle_tick_secs=300))
    dead = sim.world.bootstrap[0]
    sim.at(START + 0.1 * 86_400, sim.relay_down, dead, None)
    return sim, dead


def test_a_relay_dead_for_good_is_dialled_once_a_day():
    sim, dead = _dead_relay_world(4)
    result = sim.run()
    _assert_clean(result)
    dials = sim.checker.dials[dead]  # (the last 25 h of them)
    assert len(dials) == 2 and 23 * 3600 <= dials[1] - dials[0] <= 25 * 3600, [(t - START) / 3600 for t in dials]


@pytest.mark.parametrize("fails_by", ["session dropped", "handshake refused"])
def test_a_dead_relay_whose_daily_attempt_failed_is_not_judged_neglected_till_the_next(fails_by):
    """Seed 6's year (neglected_relay, day 313.5; the checker's mistake): a relay down for a
    day, dead to gsync, came back flapping; gsync's daily attempt found it up and lost the
    session within seconds, a failure (``record_disconnect``; or found it down a moment): the
    relay stays dead, its next attempt a day later, as SPEC asks. The checker's leave for a
    dead relay ran 26 h from its return, not from the failed attempt: it judged the relay,
    up since, neglected."""
    sim, dead = _dead_relay_world(3.4)
    back = START + 1.27 * 86_400  # (about 20 h before the daily attempt)
    sim.at(back, sim.relay_up, dead, True)
    dialled, dropped = sim.checker.dialled, []

    def daily_attempt_dropped(url):
        times = sim.checker.dials.get(url)
        if url == dead and sim.clock.now > back and times and sim.clock.now - times[-1] > 20 * 3600 and not dropped:
            dropped.append(sim.clock.now)
            if fails_by == "session dropped":
                sim.at(sim.clock.now + 10, sim.relay_down, dead, 30.0)  # its session gone within seconds
            else:
                sim.relay_down(dead, 30.0)  # a restart: the handshake finds it down
        dialled(url)

    sim.checker.dialled = daily_attempt_dropped
    result = sim.run()
    dials = [t for t in sim.checker.dials[dead] if t >= dropped[0]]
    assert len(dials) == 2 and 23 * 3600 <= dials[1] - dials[0] <= 25 * 3600, [(t - START) / 3600 for t in dials]
    assert dials[1] > back + 26 * 3600 + 2 * 4 * 3600  # (two windows past the leave from its return)
    _assert_clean(result)


def test_a_relay_down_20_h_of_26_in_two_outages_is_dead_to_gsync_and_not_judged_neglected():
    """Seed 313's year (neglected_relay, day 9.5; the checker's mistake): relay2 was down for
    14.6 h, up for 38 minutes (flapping, between two of gsync's hourly dials), then down for
    18.2 h: gsync's dials failed for a day, and it is dead to gsync (one attempt a day, SPEC
    §5). The checker's leave for a dead relay counted one outage of 20 h, not 20 h down of
    the 26: it judged the relay, up since, neglected before its daily attempt."""
    sim = Simulation(SimOptions(seed=4, days=2.0, relays=3, repos=8, faults=False, idle_tick_secs=300))
    dead = sim.world.bootstrap[0]
    first, gap, second = START + 0.1 * 86_400, 14 * 3600, 12 * 3600
    sim.at(first, sim.relay_down, dead, gap)
    sim.at(first + gap + 30, sim.relay_down, dead, second)  # up 30 s between the two
    seen = []
    sim.at(first + gap + 30 + second + 60, lambda: seen.append(sim.manager.health.is_dead(dead, sim.clock.now)))
    result = sim.run()
    assert seen == [True]  # gsync's dials failed for a day: dead to it, one attempt a day
    _assert_clean(result)


def test_a_relay_that_cuts_every_session_within_a_minute_is_backed_off_to_the_cap_and_not_judged_neglected():
    """Seed 326's year (neglected_relay, day 201.5; the checker's mistake): relay1, restarting
    every few minutes, came back from a longer outage and cut gsync's next three sessions
    within 17-35 s each. A session over within PROVEN_SESSION_SECS is a failure to gsync
    (``record_disconnect``: a relay that accepts and drops backs off to the cap), so it was
    dialled once an hour while up nearly all the time. The checker owed it a session for
    that time. Here the relay goes down for 10 s 20 s into each of gsync's sessions."""
    sim = Simulation(SimOptions(seed=4, days=1.0, relays=3, repos=8, faults=False, idle_tick_secs=300))
    cutting = sim.world.bootstrap[0]
    session_changed = sim.checker.session_changed

    def cut_each_session(url, delta, conn=None):
        session_changed(url, delta, conn)
        if url == cutting and delta > 0 and sim.clock.now > START + 0.1 * 86_400:
            sim.at(sim.clock.now + 20, sim.relay_down, cutting, 10)

    sim.checker.session_changed = cut_each_session
    sim.at(START + 0.1 * 86_400, sim.relay_down, cutting, 10)  # (its first session, from the start)
    result = sim.run()
    _assert_clean(result)
    dials = sim.checker.dials[cutting][1:]  # (those after its first session)
    gaps = [b - a for a, b in zip(dials, dials[1:], strict=False)]
    assert max(gaps) == pytest.approx(constants.MAX_BACKOFF_SECS, abs=310), gaps  # backed off to the cap
    assert len([g for g in gaps if g > 3000]) >= 12, gaps  # (and kept there: every dial's session cut)


def test_a_dead_relays_daily_attempt_a_killed_gsync_had_not_saved_is_not_judged_a_second_dial():
    """Seed 2's year (dead_dialled, day 228.52; the checker's mistake): gsync killed 54 s
    after a dead relay's daily attempt, before the tick that saves its failure; the next
    process, a minute later, knew the day before's attempt and made this one again. A kill
    loses what was not saved (every STATE_SAVE_SECS in production): not gsync's to know."""
    sim, dead = _dead_relay_world(3.2)
    dead_at = START + 0.1 * 86_400 + constants.DEAD_AFTER_SECS + 3600
    dialled, killed = sim.checker.dialled, []

    def dialled_then_killed(url):
        dialled(url)
        if url == dead and sim.clock.now > dead_at and not killed:
            killed.append(sim.clock.now)
            assert sim.manager.saved.saved_at < sim.clock.now
            sim.at(sim.clock.now + 5, sim.stop_gsync, False)
            sim.at(sim.clock.now + 65, sim.start_gsync)

    sim.checker.dialled = dialled_then_killed
    _assert_clean(sim.run())
    dials = [t for t in sim.checker.dials[dead] if t >= killed[0]]
    assert len(dials) == 3 and dials[1] - dials[0] < 120, [(t - START) / 3600 for t in dials]  # again at once


def test_a_dead_relay_retired_and_listed_again_between_two_samples_keeps_its_dead_mark():
    """Seed 329's year (dead_dialled x11 from day 75.37): relay5, down for good, dead to
    gsync, was dropped by a repository and listed again 4 s later; retired, it left its dead
    mark with it and was dialled with backoff anew (the checker, which samples gsync's table
    every 10 minutes and never saw it leave, counted its dials from when it went down). A
    retired relay's dead mark is kept a day now (``health.retire``): relisted, it is dialled
    at its daily attempt, and the checker judges its dials from when it went down."""
    sim = Simulation(SimOptions(seed=4, days=3.2, faults=False, **SMALL))
    relay2 = sim.world.relay_urls[2]
    sim.faults.abandon_rng = random.Random(1)
    listing, gone, last = [], [], []

    def abandoned():
        listing.extend(repo for repo in sim.world.repos if relay2 in repo.relays)
        sim.faults.abandon()  # (relay2 the only relay listed that is not a bootstrap one)

    def listed_again():
        gone.append(relay2 not in sim.manager.relays)
        last.append(sim.checker.dials[relay2][-1])
        for repo in listing:
            repo.relays.append(relay2)
            sim.publish(sim.world.announce(repo, int(sim.clock.now)), list(repo.relays), own=True)

    sim.at(START + 0.1 * 86_400, sim.relay_down, relay2, None)
    back = START + 1.3 * 86_400 + 200  # (dead to gsync since day 1.15; samples at 10-minute marks)
    sim.at(back - 120, abandoned)
    sim.at(back, listed_again)
    after, judged = [], []

    def at_the_end():
        after.extend(t for t in sim.checker.dials[relay2] if t >= back)  # (the last 25 h of them)
        # and the checker judges it so: a dial now, hours after the daily one, breaks dead_dialled
        violations = sim.checker.violations
        prior = list(violations.get("dead_dialled", ()))
        sim.checker.dialled(relay2)
        judged.append(len(violations.pop("dead_dialled", ())) > len(prior))
        if prior:
            violations["dead_dialled"] = prior  # (gsync's own, if any: _assert_clean shows them)

    sim.at(START + 3.19 * 86_400, at_the_end)
    _assert_clean(sim.run())
    assert listing and gone == [True]
    assert after and after[0] - last[0] >= constants.DEAD_RETRY_SECS, [(t - START) / 86_400 for t in after]
    assert judged == [True]


def test_a_dead_relay_retired_and_listed_again_is_judged_from_its_return():
    """A relay retired keeps its failure streak a day (bounded tables): down for good,
    dropped by every repository listing it (retired), listed again over a day later, it is
    dialled with backoff for DEAD_AFTER_SECS before it is dead again, once a day after.
    dead_dialled counts from its return to the table (it counted from when it went down)."""
    sim = Simulation(SimOptions(seed=4, days=3.3, faults=False, **SMALL))
    relay2 = sim.world.relay_urls[2]
    sim.faults.abandon_rng = random.Random(1)
    listing = []

    def abandoned():
        listing.extend(repo for repo in sim.world.repos if relay2 in repo.relays)
        sim.faults.abandon()  # (relay2 the only relay listed that is not a bootstrap one)

    sim.at(START + 0.1 * 86_400, sim.relay_down, relay2, None)
    sim.at(START + 0.2 * 86_400, abandoned)
    back = START + 1.3 * 86_400

    def listed_again():
        assert relay2 not in sim.manager.relays
        for repo in listing:
            repo.relays.append(relay2)
            sim.publish(sim.world.announce(repo, int(sim.clock.now)), list(repo.relays), own=True)

    sim.at(back, listed_again)
    _assert_clean(sim.run())
    assert listing and sim.faults.counts == {"abandoned": 1}
    dials = sim.checker.dials[relay2]  # (the last 25 h of them)
    assert len(dials) == 2 and dials[0] > back + constants.DEAD_AFTER_SECS - 2 * 3600, [(t - START) / 86_400 for t in dials]
    assert 23 * 3600 <= dials[1] - dials[0] <= 25 * 3600


def test_a_relay_listed_by_an_announcement_the_own_relay_lost_is_not_judged_left_in_the_table():
    """Seed 1's year (relay_table, day 233.9; the checker's mistake): the newest announcement
    of a repository listed relay2, dead since; the own relay lost everything and took back
    the older one, from the one relay still up that held it. gsync keeps the newest
    announcement its self-subscription showed (SPEC §3: a newer one replaces the relay set)
    until it restarts, and relay2 in its table: the checker judged that against the older one."""
    sim = Simulation(SimOptions(seed=4, days=1.6, faults=False, **SMALL))
    relay2 = sim.world.spare_urls[0]  # (listed by no repository yet)
    repos = []

    def announce_with_relay2():
        repos.append(repo := sim.world.repos[0])
        repo.relays.append(relay2)  # published to relay2 only, and to the own relay
        sim.publish(sim.world.announce(repo, int(sim.clock.now)), [relay2], own=True)
        repo.relays.remove(relay2)

    sim.at(START + 0.05 * 86_400, announce_with_relay2)
    sim.at(START + 0.1 * 86_400, sim.relay_down, relay2, None)
    sim.at(START + 0.2 * 86_400 - 1, _no_witness, sim)
    sim.at(START + 0.2 * 86_400, sim.own_away, 60.0, float("inf"))
    seen = []
    sim.at(START + 1.55 * 86_400, lambda: seen.append((relay2 in sim.manager.relays,
                                                       relay2 in sim.checker.wanted_relays()[0])))
    result = sim.run()
    assert seen == [(True, False)]  # in gsync's table; the own relay's announcement does not list it
    _assert_clean(result, (*KNOWN, "own_loss_refilled"))  # (``_no_witness``: gsync does not see the loss)


def _no_witness(sim: Simulation) -> None:
    """gsync will not see the own relay's next loss (``sync.own_witness``: it knows no regular
    event it stored, as a process that stored only announcements), so it does not start every
    relay fresh and offer what it follows again: the own relay takes back what the relays
    still up hold (the tests below were found in worlds where gsync did not look)."""
    sim.manager.own_relay.witness = OwnWitness()


def _newest_announcement_lost(sim: Simulation, relay2: str) -> None:
    """Scheduled on ``sim``: repository 0 announced listing ``relay2`` (to relay2 and the own
    relay), then without it (to the own relay only); the own relay loses that newest one and
    takes the older one back (a client sends it once more)."""
    published = []

    def announce(with_relay2: bool):
        repo = sim.world.repos[0]  # (made when the run starts)
        if with_relay2:
            repo.relays.append(relay2)
        event = sim.world.announce(repo, int(sim.clock.now))
        if with_relay2:
            repo.relays.remove(relay2)
        sim.publish(event, [relay2] if with_relay2 else [], own=True)
        published.append(event)

    sim.at(START + 0.02 * 86_400, announce, True)
    sim.at(START + 0.05 * 86_400, announce, False)  # to the own relay only: lost with it
    sim.at(START + 0.05 * 86_400 + 9, _no_witness, sim)  # (found in worlds where gsync did not look)
    sim.at(START + 0.05 * 86_400 + 10, sim.own_away, 60.0, 30.0)
    sim.at(START + 0.06 * 86_400, lambda: sim.publish(published[0], [], own=True))


def test_a_relay_only_the_older_announcement_lists_is_followed_again_once_the_own_relay_holds_that_one_after_a_loss():
    """Seed 1, 20 relays x 200 repos, 30 days (neglected_relay from day 28.5): the newest
    announcement of a repository dropped relay2; the own relay lost it and took back the
    older one, which lists relay2. gsync retired relay2 then (it followed the newest it was
    shown, SPEC §3), and the checker was taught so. Since seed 265 at fault scale 2 (a newer
    one still sat on a relay only the older one listed), an older announcement the own relay
    shows after the followed one brings its relays back (``RepoSyncIndex.held_instead``)."""
    sim = Simulation(SimOptions(seed=4, days=0.55, faults=False, **SMALL))
    relay2 = sim.world.spare_urls[0]  # (listed by no repository yet)
    seen = []
    _newest_announcement_lost(sim, relay2)
    sim.at(START + 0.04 * 86_400, lambda: seen.append(relay2 in sim.manager.relays))
    sim.at(START + 0.5 * 86_400, lambda: seen.append((relay2 in sim.manager.relays,
                                                      relay2 in sim.checker.wanted_relays()[0])))
    result = sim.run()
    assert seen == [True, (True, True)]  # dialled, and kept: the own relay's announcement lists it
    assert sim.relays[relay2].up
    _assert_clean(result)


def test_events_only_the_older_announcement_s_relay_holds_arrive_after_a_loss_took_the_newest():
    """Seed 52's 30 days of 3 x 8 (left_behind, 4 roots from day 29.2): a loss took a
    repository's newest announcement, and the own relay took back the older one, listing
    relay2. gsync followed the newest it was shown (SPEC §3) until it restarted, and relay2's
    roots of that repository waited for the restart (the checker was taught not to judge
    them). Now the older one shown after the followed one adds its relays: they arrive."""
    sim = Simulation(SimOptions(seed=4, days=1.6, faults=False, liveness_after=0.1, **SMALL))
    relay2 = sim.world.spare_urls[0]  # (listed by no repository yet)
    _newest_announcement_lost(sim, relay2)
    roots = []

    def root_on_relay2_only():
        roots.append(sim.world.root(sim.world.repos[0], int(sim.clock.now)))
        sim.publish(roots[-1], [relay2], own=False)

    sim.at(START + 0.07 * 86_400, root_on_relay2_only)
    result = sim.run()
    assert sim.checker.liveness_checks and roots[0].id in sim.own.store
    _assert_clean(result)


def test_an_announcement_between_the_held_one_and_the_newest_lost_arrives_from_a_relay_only_the_held_one_lists():
    """Seed 118's 45 days at abandon rate 1 (left_behind from day 44.04): a loss took a
    repository's newest announcement, and the own relay took back an older one, listing
    relay2; on relay2 alone, an announcement between the two, listing the own relay. gsync
    followed the newest it was shown (SPEC §3), relay2 not its repository's relay, and the
    checker was taught so (owed only if newer than what gsync was shown). Now the older one
    shown after the followed one adds its relays: the one between arrives."""
    sim = Simulation(SimOptions(seed=4, days=1.6, faults=False, liveness_after=0.1, **SMALL))
    relay2 = sim.world.spare_urls[0]  # (listed by no repository yet)
    _newest_announcement_lost(sim, relay2)
    between = []

    def announced_on_relay2_only():
        repo = sim.world.repos[0]
        newest, repo.announcement = repo.announcement, None  # (else made newer than it)
        repo.relays.append(relay2)
        between.append(sim.world.announce(repo, int(START + 0.03 * 86_400)))
        repo.relays.remove(relay2)
        repo.announcement = newest
        sim.publish(between[-1], [relay2], own=False)

    sim.at(START + 0.07 * 86_400, announced_on_relay2_only)
    result = sim.run()
    assert sim.checker.liveness_checks and between[0].id in sim.own.store
    _assert_clean(result)


def test_a_relay_listed_by_the_older_announcement_a_restarted_gsync_was_shown_is_not_judged_left_in_the_table():
    """Seed 6's year (relay_table, day 129.35; the checker's mistake): a loss took the newest
    announcement of a repository, which dropped relay2, and the own relay took back the older
    one, listing relay2; gsync restarted, and was shown the older one only. relay2 went down
    for good, and the own relay lost everything: gsync keeps the newest announcement its self-subscription showed (SPEC
    §3) until it restarts, the older one, and relay2 in its table: the checker judged that
    against the newest the own relay ever stored, which the running gsync never saw."""
    sim = Simulation(SimOptions(seed=4, days=1.6, faults=False, **SMALL))
    relay2 = sim.world.spare_urls[0]  # (listed by no repository yet)
    seen = []
    _newest_announcement_lost(sim, relay2)
    sim.at(START + 0.1 * 86_400, sim.stop_gsync, True)
    sim.at(START + 0.1 * 86_400 + 30, sim.start_gsync)  # shown the older one only
    sim.at(START + 0.15 * 86_400, lambda: seen.append(relay2 in sim.manager.relays))
    sim.at(START + 0.16 * 86_400, sim.relay_down, relay2, None)  # (no one delivers the older one again)
    sim.at(START + 0.2 * 86_400 - 1, _no_witness, sim)
    sim.at(START + 0.2 * 86_400, sim.own_away, 60.0, float("inf"))
    sim.at(START + 1.55 * 86_400, lambda: seen.append((relay2 in sim.manager.relays,
                                                       relay2 in sim.checker.wanted_relays()[0])))
    result = sim.run()
    assert seen == [True, (True, False)]  # tabled again after the restart; the own relay lists it no more
    _assert_clean(result, (*KNOWN, "own_loss_refilled"))  # (``_no_witness``: gsync does not see the loss)


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_a_relay_retired_and_listed_again_is_judged_for_refused_asks_from_its_return():
    """Seed 2's year (refused_asked_again, day 4.71; the checker's mistake, as the dead mark
    was): relay2 refused #a on day 4.005; dropped by every repository on day 4.23, gsync
    retired it, its pauses with it (tables follow the work, SPEC §8); listed again on day
    4.71, it was asked #a twice, a trial and the REQ it held, counted with the asks before
    it left. A relay's refusals now go with it from the table, as its dead mark does."""
    _assert_clean(run_replayable(seed=2, days=5, relays=6, repos=30, liveness_after=363, **OLDER_WORLD))


def test_a_refusal_a_killed_gsync_had_not_saved_is_not_counted_against_the_next_process():
    """Seed 1's year (refused_asked_again, day 222.78; the checker's mistake, as for unsaved
    dials): relay1 refused #e to a new root's live coverage; gsync paused it, and was killed
    before a save wrote the pause (the year's idle tick of 5 minutes left it unsaved 288 s;
    the simulator now ticks again within 2 s of a message, saves within STATE_SAVE_SECS, as production).
    The next process cannot know it: its fresh start asked #e packed (live and historic),
    then alone, counted as asks 3 to 5 of the refusal the last process read. Its own read of
    the refusal opens the probe period anew."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, publish_per_day=0.001, **SMALL))
    url = sim.world.relay_urls[1]
    read, killed, asks_after = [], [], []
    relay_frame, client_frame = sim.checker.relay_frame, sim.checker.client_frame

    def refuse_and_publish():
        sim.relays[url].refused_tags = frozenset({"e"})
        repo = next(r for r in sim.world.repos if url in r.relays)
        sim.publish(sim.world.root(repo, int(sim.clock.now)), list(repo.relays), own=True)

    def kill_once_paused():
        assert sim.manager.saved.saved_at < read[0]  # not saved since the refusal
        if not sim.manager.relays[url].paused:
            sim.at(sim.clock.now + 0.05, kill_once_paused)
            return
        killed.append(sim.clock.now)
        sim.stop_gsync(False)
        sim.at(sim.clock.now + 5, sim.start_gsync)

    def frame_read(conn, frame):
        relay_frame(conn, frame)
        if conn.relay == url and '"blocked: #e' in frame and not read:
            read.append(sim.clock.now)
            kill_once_paused()

    def frame_sent(conn, verb, text):
        client_frame(conn, verb, text)
        if killed and conn.relay == url and verb == "REQ" and '"#e"' in text:
            asks_after.append(text.split(",", 2)[1])

    sim.checker.relay_frame, sim.checker.client_frame = frame_read, frame_sent
    sim.at(START + 0.2 * 86_400, lambda: sim.at(sim.tick_due + 2, refuse_and_publish))  # (just after an idle tick)
    _assert_clean(sim.run())
    assert len(asks_after) >= 3, asks_after  # the next process asked #e again: packed, then alone


def test_a_refusal_gsync_had_no_verdict_on_when_it_stopped_is_not_counted_against_the_next_process():
    """Seed 82's year (refused_asked_again, day 47.97; the checker's mistake): relay1 refused a
    REQ for its #e filter; gsync split it by shape, and the trial of #e alone was closed "too
    many concurrent REQs" again and again for 16 minutes: no verdict, nothing paused, its saves
    since with no pause to write. gsync was killed and started again; the new process's first
    REQs asked #e packed with other shapes, counted as asks 2 to 6 of the refusal the last
    process read (the kill came after saves: ``gsync_killed`` kept it). A process
    cannot know a refusal the last held no pause of; one it paused is judged on after a
    restart (its pause restored)."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, publish_per_day=0.001, **SMALL))
    url = sim.world.relay_urls[1]
    shape = (None, ("z",), False, False)  # a tag gsync never asks: only these REQs use it
    counts, serial = [], iter(range(10_000, 20_000))

    def conn():
        return types.SimpleNamespace(relay=url, number=next(serial), starts=[])

    def ask(times):
        for _ in range(times):
            c = conn()
            sim.checker.client_frame(c, "REQ", json.dumps(["REQ", f"z{c.number}", {"#z": ["x"]}]))
        counts.append(dict(sim.checker.counts))

    def refused_then_asked(paused):
        sim.checker.relay_frame(conn(), json.dumps(["CLOSED", "r", "blocked: #z queries are not allowed here"]))
        if paused:
            sim.manager.relays[url].paused.pause(shape, sim.clock.now)
        ask(1)

    def restart():
        sim.stop_gsync(True)
        sim.at(sim.clock.now + 5, sim.start_gsync)

    day = 86_400
    sim.at(START + 0.05 * day, refused_then_asked, False)  # no verdict when it stops
    sim.at(START + 0.06 * day, restart)
    sim.at(START + 0.1 * day, ask, 2)
    sim.at(START + 0.15 * day, refused_then_asked, True)  # paused when it stops
    sim.at(START + 0.16 * day, restart)
    restored = []
    sim.at(START + 0.2 * day, lambda: restored.append(sim.manager.relays[url].paused.is_paused(shape)))
    sim.at(START + 0.2 * day, ask, 2)
    sim.run()
    assert restored == [True]
    assert counts == [{}, {}, {}, {"refused_asked_again": 1}], counts


def test_a_refused_shape_whose_kinds_probe_was_served_is_not_counted_asked_without_notes():
    """Seed 4003's year (refused_asked_again, day 112.09; the checker's mistake): relay0
    refused ``#a`` (a policy fault) and the fault ended before gsync's kinds probe, which it
    served; gsync concluded the refusal was of the notes ``#a`` may bring and asked ``#a``
    without notes in three live REQs, counted as three asks of the refused shape. Served
    without notes, the shape asked so is not counted, until the relay refuses it so too;
    asked with notes it is counted all the same, and so is everything after a probe refused.
    An ask of the shape as it was that the relay serves ends the refusal (gsync now asks it
    once more so before it concludes, and restores the shape when served)."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, publish_per_day=0.001, **SMALL))
    url = sim.world.relay_urls[1]
    serial = iter(range(10_000, 20_000))
    precise = {"kinds": sorted(NOTES_EXCLUDED), "#z": ["x"]}  # (a tag gsync never asks)
    counts = []

    def conn():
        return types.SimpleNamespace(relay=url, number=next(serial), starts=[])

    def ask(f, times=3, served=False):
        for _ in range(times):
            c = conn()
            sim.checker.client_frame(c, "REQ", json.dumps(["REQ", f"z{c.number}", f]))
            if served:
                sim.checker.relay_frame(c, json.dumps(["EOSE", f"z{c.number}"]))
        counts.append(dict(sim.checker.counts))

    def refused():
        sim.checker.relay_frame(conn(), json.dumps(["CLOSED", "r", "blocked: #z queries are not allowed here"]))

    def probed(answer):
        c = conn()
        sim.checker.client_frame(c, "REQ", json.dumps(["REQ", "probe", precise]))
        sim.checker.relay_frame(c, json.dumps(answer))

    def anew():
        sim.checker.refused_at.clear()
        sim.checker.counts.clear()
        refused()

    def asks():
        refused()
        probed(["EOSE", "probe"])
        ask(precise)
        ask({"#z": ["x"]}, 2)  # (two asks more allowed)
        ask({"#z": ["x"]}, 1)
        anew()
        probed(["EOSE", "probe"])
        refused()  # without notes too, after its probe was served
        ask(precise)
        anew()
        probed(["CLOSED", "probe", "blocked: #z queries are not allowed here"])
        ask(precise)
        anew()
        probed(["EOSE", "probe"])
        ask({"#z": ["x"]}, 1, served=True)  # asked as it was, served: the refusal is over
        ask({"#z": ["x"]})

    sim.at(START + 0.05 * 86_400, asks)
    sim.run()
    violated = {"refused_asked_again": 1}
    assert counts == [{}, {}, violated, violated, violated, {}, {}], counts


def test_a_message_in_a_quiet_stretch_brings_the_next_tick_within_two_seconds():
    """Production ticks every 2 s; the simulator ticks every 5 minutes while nothing
    happens, and a message ends that at once: what it starts that only a tick goes on with
    (the state save, a follower's release) waited for the idle tick before (a refusal's pause
    unsaved 288 s in seed 1's year)."""
    sim = Simulation(SimOptions(seed=4, days=0.25, faults=False, publish_per_day=0.001, **SMALL))
    sim.trace_lines = []
    published = []

    def publish():
        repo = sim.world.repos[0]
        published.append(sim.clock.now)
        sim.publish(sim.world.root(repo, int(sim.clock.now)), list(repo.relays), own=True)

    sim.at(START + 0.2 * 86_400, lambda: sim.at(sim.tick_due + 2, publish))  # (just after an idle tick)
    _assert_clean(sim.run())
    lines = [line.split() for line in sim.trace_lines if float(line.split()[0]) > published[0]]
    first = next(float(p[0]) for p in lines if p[1] == "msg" and p[2] != "Tick")
    tick = next(float(p[0]) for p in lines if p[1] == "msg" and p[2] == "Tick")
    assert tick <= first + SimOptions().tick_secs, (tick - first)


def test_a_relay_forgotten_at_a_start_is_judged_for_refused_asks_from_its_return():
    """Seed 94's 30 days of 3 x 8 (refused_asked_again, day 1.0065; the checker's mistake):
    relay2 refused #a on day 0.335; the own relay lost everything, and gsync, stopped and
    started again, listed no repository on relay2 when ready and forgot its saved memory,
    pauses with it; listed again, relay2 was asked #a in the new process's first REQs,
    counted with the asks before. A relay out of gsync's table and memory forgets its
    refusals, as one retired does."""
    _assert_clean(run_replayable(seed=94, days=1.01, relays=3, repos=8, idle_tick_secs=300, liveness_after=28,
                                 **OLDER_WORLD))


def test_relays_a_restarted_gsync_forgets_when_ready_are_judged_from_their_return():
    """Seed 71's year (dead_dialled from day 230.51; the checker's mistake): the own relay had
    lost its announcements; gsync, started again, listed no repository on relay3 when ready
    and forgot its saved memory, dead mark included; 400 s later relay3 was listed again and
    dialled with backoff from the start, counted against the dead mark gsync no longer had
    (the checker's 10-minute sample never saw relay3 out of the table). The checker is now
    told what a process forgets when it forgets it."""
    sim = Simulation(SimOptions(seed=4, days=0.3, faults=False, publish_per_day=0.001, **SMALL))
    forgotten, real = [], sim.checker.forgotten
    sim.checker.forgotten = lambda urls: (forgotten.append(set(urls)), real(urls))
    restart = START + 0.1 * 86_400
    listed = [u for u in sim.world.relay_urls if u not in sim.world.bootstrap]

    def lose_all_and_restart():
        for url in listed:
            sim.checker.tabled_since[url] = START  # (as if tabled since the start)
        sim.stop_gsync(True)
        _forget_confirmed(sim)  # (else relays that confirmed what it lost are asked: not forgotten)
        sim.own_away(30.0, float("inf"))  # back empty: no announcement listing them
        sim.at(sim.clock.now + 60, sim.start_gsync)

    sim.at(restart, lose_all_and_restart)
    _assert_clean(sim.run())
    assert forgotten and set(listed) <= forgotten[0], forgotten
    assert all(sim.checker.tabled_since.get(url, restart) >= restart for url in listed)


def test_a_quiet_world_redials_a_relay_when_its_backoff_ends_not_at_the_idle_tick():
    """The simulator ticks every 5 minutes while nothing happens; the tick that redials a
    relay comes when its backoff ends all the same (production ticks every 2 s): how long
    gsync stays away from a relay is gsync's doing, which the invariants judge."""
    sim = Simulation(SimOptions(seed=4, days=0.2, relays=3, repos=8, faults=False, idle_tick_secs=300))
    url = sim.world.bootstrap[0]
    down_at = START + 0.1 * 86_400
    sim.at(down_at, sim.relay_down, url, 20.0)
    _assert_clean(sim.run())
    after = [t - down_at for t in sim.checker.dials[url] if t > down_at]
    assert after and after[-1] <= 20 + 40 + 2 * constants.MAINTENANCE_TICK_SECS, after  # 5 + 10 + 20 s refused


def test_the_dead_relay_invariant_catches_a_relay_dialled_every_hour(monkeypatch):
    """The invariant's teeth: with the daily retry of a dead relay made hourly, it breaks."""
    from gsync.sync import health
    monkeypatch.setattr(health, "DEAD_RETRY_SECS", 3600.0)
    sim, dead = _dead_relay_world(4)
    result = sim.run()
    assert "dead_dialled" in result.violations, result.violations


@pytest.mark.slow
def test_refused_coverage_is_not_asked_again_before_its_probe():
    """Seed 2 (6 relays, 20 repositories, 10 days): relay5 refuses ``#a`` (``blocked:``) on
    day 7.009, as a quick reconnect sends its live coverage; the REQ is split one shape a
    REQ, and its subscription cap refuses those ("too many concurrent REQs"), so no shape
    has its verdict when gsync consolidates. The rebuild packed ``#a`` with the others
    again: refused, split, asked alone again (three asks after the refusal; SPEC §5: do not
    recreate that coverage, one probe after 24 h). Now the shapes of a REQ refused by
    policy go alone until each has its verdict (``CoveragePauses.suspect``)."""
    result = run_replayable(seed=2, days=10, relays=6, repos=20, idle_tick_secs=300, abandon_per_day=0,
                            **OLDER_WORLD)
    assert "refused_asked_again" not in result.violations, result.violations["refused_asked_again"]


def test_junk_is_never_taken():
    sim = Simulation(SimOptions(seed=3, days=0.5, faults=False, **SMALL))
    for url in sim.world.relay_urls:
        sim.faults.junk_until[url] = float("inf")
    result = sim.run()
    _assert_clean(result)
    assert sim.faults.injected > 20


def test_the_forged_and_unrequested_invariants_catch_a_connection_that_checks_nothing(monkeypatch):
    """Their teeth: with the connection's signature check and filter match turned off, the
    forged and unrequested events relays inject (the junk fault) are taken and delivered."""
    from gsync.io import connection
    from gsync.protocol.filters import FilterSet

    monkeypatch.setattr(connection, "verify_event", lambda event: event)
    monkeypatch.setattr(FilterSet, "matching", lambda self, event: (0,))
    sim = Simulation(SimOptions(seed=3, days=0.5, faults=False, **SMALL))
    for url in sim.world.relay_urls:  # every answer carries junk
        sim.faults.junk_until[url] = float("inf")
    result = sim.run()
    assert {"forged_accepted", "forged_delivered", "unrequested_accepted"} <= result.violations.keys()


def test_the_status_invariant_catches_a_move_the_table_lacks(monkeypatch):
    from gsync.sync import status

    monkeypatch.delitem(status.TRANSITIONS, (status.ConnectionStatus.SYNCING, status.Fact.HISTORIC_DONE))
    result = run(seed=3, days=0.2, **SMALL)
    assert "illegal_status_move" in result.violations


# -- bugs the simulator found, fixed --------------------------------------------------------
# Each pinned in the world it was found in: before relays abandoned by their repositories
# (faults.ABANDON_PER_DAY) were a fault, which changes every run from the first one on, and
# before 2026-12-05 grew the world (``OLDER_WORLD``: the same worlds as then).


@pytest.mark.slow
def test_seed_1_six_relays_the_own_relay_restarted_empty():
    """Found by seed 1 (6 relays, 20 repositories, 10 days): on day 3.88 the own relay comes
    back empty (in memory); gsync, which still holds repo6 as accepted, delivers its events
    before the announcement and they are refused ``blocked:`` (no such repository hosted).
    The announcement and the roots then arrive again, but their release keys were only
    taken for a repository or root new to gsync: the state and 17 comments stayed in the
    rejected index (7 days). Fixed in OwnRelaySide (announcement_arrivals,
    on_batch_window_closed); with either half reverted this seed leaves events behind."""
    result = run_replayable(seed=1, days=10, relays=6, repos=20, idle_tick_secs=300, abandon_per_day=0,
                            **OLDER_WORLD)
    assert "left_behind" not in result.violations, result.violations["left_behind"][:3]


A = "wss://a.example"


def test_events_refused_while_the_own_relay_lost_their_repository_are_released_when_it_holds_it_again(tmp_path):
    """The in-process form of seed 1's bug: a repository gsync knows, its state and a reply
    refused by an own relay that restarted empty; the own relay then shows the announcement
    and the root again (delivered anew): both refusals are released (fetched again)."""
    h = ManagerHarness(tmp_path)
    owner = Author.named("u0")
    repo = announcement(owner, "r0", relays=[A])
    bug = issue(Author.named("bob"), repo)
    h.own_relay_holds(repo, bug)
    refused = [state(owner, "r0"), comment(Author.named("alice"), bug)]
    for event in refused:
        h.feed(DeliveryAnswered(event, "rejected", "blocked: not a repository hosted here", A))
    assert all(event.id in h.manager.rejected for event in refused)
    h.own_relay_holds(repo, bug)
    h.advance(constants.MAINTENANCE_TICK_SECS)
    assert [event.id in h.manager.rejected for event in refused] == [False, False]


# -- the relay model against LocalRelay -----------------------------------------------------


def _world_events(n_repos=12):
    world = World(random.Random(11), relays=3, repos=n_repos)
    events = [e for _, e in world.history(int(START))]
    # a crowded second: eight roots of one repository at the same created_at
    repo = world.repos[0]
    events += [world.root(repo, int(START) - 5000) for _ in range(8)]
    return world, events


def _scripted_filters(world, events):
    repo = world.repos[0]
    roots = [e for e in events if e.kind in (1617, 1621)]
    crowded = int(START) - 5000
    return [
        {"kinds": [30617]},
        {"kinds": [30617, 10317], "limit": 5},
        {"kinds": [30618], "#d": [r.d for r in world.repos[:4]]},
        {"#a": [repo.address]},
        {"#a": [repo.address], "limit": 3},
        {"#a": [repo.address], "until": crowded, "limit": 4},
        {"#a": [repo.address], "since": crowded},
        {"#E": [r.id for r in roots[:5]]},
        {"#e": [r.id for r in roots[:5]], "kinds": [1111]},
        {"ids": [e.id for e in events[::7]]},
        {"authors": [repo.owner.pubkey], "kinds": [30617, 30618]},
        {"kinds": [1111], "since": int(START) - 100 * 86400, "until": int(START) - 50 * 86400},
        {"kinds": [1621], "limit": 0},
        {"#q": ["nothing"]},
    ]


def _ask_localrelay(ws, sub_id, flt):
    ws.send(json.dumps(["REQ", sub_id, flt]))
    ids, end = [], None
    while end is None:
        msg = json.loads(ws.recv())
        if msg[0] == "EVENT" and msg[1] == sub_id:
            ids.append(msg[2]["id"])
        elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub_id:
            end = msg[0]
    ws.send(json.dumps(["CLOSE", sub_id]))
    return ids, end


def _ask_model(relay, sub_id, flt):
    ids, end = [], None
    for frame in relay.handle(1, json.dumps(["REQ", sub_id, flt])):
        msg = json.loads(frame)
        if msg[0] == "EVENT":
            ids.append(msg[2]["id"])
        elif msg[0] in ("EOSE", "CLOSED"):
            end = msg[0]
    relay.handle(1, json.dumps(["CLOSE", sub_id]))
    return ids, end


def _reconcile(send, receive, flt, items):
    return negentropy_ws.reconcile(send, receive, "neg-1", filter_from_json(flt), items, deadline_secs=10)


def _model_wire(model):
    """``send`` and ``receive`` over the model's session 1: it answers at once."""
    pending: list = []

    def send(text):
        pending.extend(model.handle(1, text))

    def receive(timeout):
        return pending.pop(0) if pending else None

    return send, receive


def test_the_relay_model_answers_reqs_and_neg_opens_as_localrelay_does(relay_factory, tmp_path):
    """The same scripted REQs (filters with since/until/limit, ids, tags, a crowded second,
    limit 0) and NIP-77 reconciliations, sent to a LocalRelay and to the model holding the
    same events: the same events in the same order, the same end (EOSE), the same ids found
    missing and held."""
    world, events = _world_events()
    local = relay_factory(seed_file=write_seed_file(events, str(tmp_path)))
    model = SimRelay("wss://model.example", page_cap=500, nip77=True)
    for e in events:
        model.store.add(e)
    model.open_session(1)
    ws = websocket.create_connection(local.url, timeout=10)
    try:
        answered = 0
        for i, flt in enumerate(_scripted_filters(world, events)):
            theirs = _ask_localrelay(ws, f"s{i}", flt)
            ours = _ask_model(model, f"s{i}", flt)
            assert ours == theirs, f"filter {flt}: model {ours} != LocalRelay {theirs}"
            answered += len(ours[0])
        assert answered > 50
        rng = random.Random(5)
        for flt in ({"kinds": [30617]}, {"#a": [world.repos[0].address]}, {"kinds": [1111]}, {}):
            matching = [e for e in events if filter_from_json(flt).matches(e)]
            held = [(e.created_at, e.id) for e in matching if rng.random() < 0.5]
            held += [(int(START) - 7, "ab" * 32)]  # one the relays lack
            ours = _reconcile(*_model_wire(model), flt, held)
            theirs = _reconcile(ws.send, lambda timeout: ws.recv(), flt, held)
            assert sorted(ours.need_ids) == sorted(theirs.need_ids), flt
            assert sorted(ours.have_ids) == sorted(theirs.have_ids) == ["ab" * 32], flt
            assert len(ours.need_ids) == len(matching) - len(held) + 1
    finally:
        ws.close()


def test_the_model_refuses_as_told_closed_with_reasons():
    relay = SimRelay("wss://m.example", max_subs=1)
    relay.open_session(1)
    assert json.loads(relay.handle(1, '["REQ","a",{"kinds":[1]}]')[-1]) == ["EOSE", "a"]
    assert json.loads(relay.handle(1, '["REQ","b",{"kinds":[1]}]')[0])[:2] == ["CLOSED", "b"]
    relay.handle(1, '["CLOSE","a"]')
    relay.refused_tags = frozenset({"q"})
    closed = json.loads(relay.handle(1, '["REQ","c",{"#q":["x"]}]')[0])
    assert closed[0] == "CLOSED" and closed[2].startswith("blocked:")
    relay.rate_limited_until = float("inf")
    assert json.loads(relay.handle(1, '["REQ","d",{"kinds":[1]}]')[0])[2].startswith("rate-limited:")


def test_the_model_refuses_in_a_notice_alone_where_told_naming_the_req_or_not():
    """``--notice-refusals``: a refusal is a NOTICE alone (nostream); ``--notice-names``: one
    naming the REQ (NIP-01's form for a while in 2023)."""
    for names in (False, True):
        relay = SimRelay("wss://m.example")
        relay.notice_refusals, relay.notice_names = True, names
        relay.refused_tags = frozenset({"q"})
        relay.open_session(1)
        [notice] = [json.loads(m) for m in relay.handle(1, '["REQ","c",{"#q":["x"]}]')]
        assert notice == (["NOTICE", "c", "blocked: #q queries are not allowed here"] if names
                          else ["NOTICE", "blocked: #q queries are not allowed here"])


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_a_nip77_exchange_on_a_relay_asking_for_auth_waits_for_our_auth_to_be_read(monkeypatch):
    """The simulator runs an exchange synchronously: on a relay challenging at connect it ran
    ahead of the challenge in flight and was refused ``auth-required:`` before gsync had
    read it (TCP's order never lets that happen), and NIP-77 was off a day on every such
    relay. It waits now for the relay to have read our AUTH: the NEG-OPENs there are served."""
    answers: list[str] = []
    opened = SimRelay.on_neg_open

    def on_neg_open(self, session, sub_id, raw_filter, message_hex):
        out = opened(self, session, sub_id, raw_filter, message_hex)
        if self.auth_required:
            answers.append(json.loads(out[-1])[0])
        return out

    monkeypatch.setattr(SimRelay, "on_neg_open", on_neg_open)
    sim = Simulation(SimOptions(seed=5, days=0.3, relays=20, repos=40))
    sim.run()
    assert any(r.auth_required and r.nip77 for r in sim.relays.values())
    assert answers and set(answers) == {"NEG-MSG"}, answers
    assert not sim.checker.violations


def test_the_model_asks_for_auth_as_khatru_does_where_told():
    """``--auth-late``: no challenge at connect; one before each refusal for want of AUTH; our
    AUTH answered OK at once but taken a moment later, so what is read with it is refused
    again, and what comes after is served."""
    from gsync.io.connection import auth_event
    from gsync.protocol.event import generate_secret
    from gsync.sim.relay import AUTH_TAKES_SECS

    relay = SimRelay("wss://m.example", auth_required=True)
    relay.auth_late = True
    assert relay.open_session(1) == []
    challenge, closed = (json.loads(m) for m in relay.handle(1, '["REQ","a",{"kinds":[1]}]'))
    assert challenge == ["AUTH", "challenge-1"] and closed[:2] == ["CLOSED", "a"]
    assert closed[2].startswith("auth-required:")
    auth = auth_event(generate_secret(), relay.url, "challenge-1", 1000)
    [ok] = (json.loads(m) for m in relay.handle(1, json.dumps(["AUTH", auth.to_dict()])))
    assert ok[:3] == ["OK", auth.id, True]
    assert json.loads(relay.handle(1, '["REQ","a",{"kinds":[1]}]')[0]) == ["AUTH", "challenge-1"]
    relay.now += AUTH_TAKES_SECS
    assert json.loads(relay.handle(1, '["REQ","a",{"kinds":[1]}]')[-1]) == ["EOSE", "a"]


def test_the_model_reads_since_as_exclusive_where_told_stored_and_live():
    """``--since-exclusive``: such a relay serves nothing dated at a filter's ``since``,
    from its store or to a live subscription; any other serves both."""
    repo = announcement(Author.named("owner"), "r")
    old, new = (issue(Author.named("bob"), repo, created_at=1000 + n) for n in (0, 1))
    for exclusive in (False, True):
        relay = SimRelay("wss://m.example")
        relay.since_exclusive = exclusive
        relay.publish(old)
        relay.open_session(1)
        stored = [json.loads(m) for m in relay.handle(1, '["REQ","x",{"since":1000}]')]
        relay.handle(1, '["REQ","live",{"since":1001}]')
        live = [json.loads(m) for m in relay.publish(new).get(1, [])]
        assert [m[2]["id"] for m in stored if m[0] == "EVENT"] == ([] if exclusive else [old.id])
        assert [m[2]["id"] for m in live if m[1] == "live"] == ([] if exclusive else [new.id])


def test_the_model_answers_each_filter_on_its_own_where_told_stored_and_live():
    """``--per-filter`` (khatru): such a relay sends a comment its root's ``#E`` and ``#e``
    both match twice, the filters' answers one after the other (newest first in each, not
    as a whole), and a live one once per filter; any other relay sends each event once."""
    repo = announcement(Author.named("owner"), "r")
    root = issue(Author.named("bob"), repo, created_at=1000)
    older = comment(Author.named("carol"), root, created_at=1001)
    newer = issue(Author.named("dan"), repo, created_at=1002)
    tags = f'{{"#E":["{root.id}"]}},{{"#a":["{repo_addr(Author.named("owner"), "r")}"]}}'
    for per_filter in (False, True):
        relay = SimRelay("wss://m.example")
        relay.per_filter = per_filter
        for event in (root, older, newer):
            relay.publish(event)
        relay.open_session(1)
        stored = [json.loads(m) for m in relay.handle(1, f'["REQ","x",{tags}]')]
        relay.handle(1, f'["REQ","live",{{"#E":["{root.id}"],"limit":0}},{{"#e":["{root.id}"],"limit":0}}]')
        live = [json.loads(m) for m in relay.publish(comment(Author.named("eve"), root, created_at=1003)).get(1, [])]
        got = [m[2]["id"] for m in stored if m[0] == "EVENT"]
        assert got == ([older.id, newer.id, root.id] if per_filter else [newer.id, older.id, root.id])
        assert len([m for m in live if m[1] == "live"]) == (2 if per_filter else 1)


@pytest.mark.slow
def test_relays_answering_each_filter_on_their_own_lose_nothing():
    """Every relay answers per filter (khatru: ngit-relay): copies within a page and pages
    not newest first as a whole still bring every event, within the traffic bounds."""
    _assert_clean(run(seed=1, days=4, liveness_after=2, **dict(SMALL, per_filter=1)))


def test_the_model_reads_a_req_s_filters_as_written_not_as_a_look_alike_read_before():
    """The relay model keeps what it read of a REQ's filters by their text: a REQ alike at
    both ends and another in the middle is read as written."""
    relay = SimRelay("wss://m.example")
    relay.open_session(1)
    a, b, c, other = (f"{n:064x}" for n in (1, 2, 3, 4))
    relay.handle(1, f'["REQ","x",{{"authors":["{a}","{b}","{c}"],"since":5}}]')
    relay.handle(1, f'["REQ","y",{{"authors":["{a}","{other}","{c}"],"since":5}}]')
    subs = relay.sessions[1].subs
    assert subs["x"][0].authors == {a, b, c} and subs["y"][0].authors == {a, other, c}
    assert subs["y"][0] == filter_from_json({"authors": [a, other, c], "since": 5})


def test_the_model_s_store_answers_a_filter_as_nip01_matching_does():
    """What the relay model's store finds for a filter (by its indexes: by its only tag's
    values, only kinds and authors checked) is what ``Filter.matches`` takes, newest first."""
    world, rng, store = World(random.Random(3), relays=3, repos=30), random.Random(5), EventStore()
    events = [event for _, event in world.history(int(START))]
    for event in events:
        store.add(event)
    for _ in range(300):
        pick = rng.sample(events, 3)
        tags = [t for e in pick for t in e.tags if len(t) >= 2 and len(t[0]) == 1]
        tag = rng.choice(tags) if tags and rng.random() < 0.8 else None
        flt = Filter.make(kinds=rng.choice([None, {e.kind for e in pick}, {pick[0].kind}]),
                          authors=rng.choice([None, None, {pick[0].pubkey}, {e.pubkey for e in pick}]),
                          tags=None if tag is None else {tag[0]: [tag[1], "x"]})
        held = sorted((e for e in store.events.values() if flt.matches(e, in_time=False)),
                      key=lambda e: (-e.created_at, e.id))
        assert store.query(flt) == held


def test_the_metric_labels_invariant_catches_a_series_of_a_relay_not_in_the_table():
    sim = Simulation(SimOptions(seed=3, days=0.1, faults=False, **SMALL))

    def stray():
        for metric in metrics.relay_labelled():
            metric.labels(**{name: "wss://gone.example" if name == "relay" else "x" for name in metric._labelnames})

    sim.at(START + 0.05 * 86_400, stray)
    kept = sim.run().violations["metric_labels"]
    assert kept[0][1].endswith("{relay=wss://gone.example} for a relay not in the table")


@pytest.mark.parametrize("away_at, lose_last", [(0.3, float("inf")), (0.005, 600.0)],
                         ids=["back empty", "its first sync's writes lost"])
def test_what_the_own_relay_lost_while_gsync_ran_is_back_within_the_hour(away_at, lose_last):
    """The own relay comes back from a minute away without what it stored: everything (a
    relay in memory), or its last 10 minutes of writes, gsync's first sync, whose events are
    older than any catch-up window. gsync asks it for a few events it had stored, finds them
    gone and starts every relay fresh: everything is back within the hour, not at each
    relay's next daily sync (``sync.own_witness``)."""
    sim = Simulation(SimOptions(seed=3, days=0.5, faults=False, **SMALL))
    held: dict[str, object] = {}
    gone_at = START + away_at * 86_400
    sim.at(gone_at - 1, lambda: held.update(sim.own.store.events))
    sim.at(gone_at, sim.own_away, 60.0, lose_last)
    lost, missing = [], []
    sim.at(gone_at + 1, lambda: lost.append(len(held) - len(sim.own.store)))
    sim.at(gone_at + 3600, lambda: missing.extend(i for i in held if i not in sim.own.store.events))
    _assert_clean(sim.run())
    assert lost[0] > 20
    assert missing == []


def test_what_the_own_relay_lost_and_gsync_left_for_the_daily_sync_is_a_violation():
    """The checker's side of the test above: gsync that finds the loss and starts no relay
    fresh (``on_loss`` a no-op) leaves the own relay without it past REFILL_SECS
    (``own_loss_refilled``); a second outage in between excuses it (its own rules judge)."""
    for again, broken in ((False, True), (True, False)):
        sim = Simulation(SimOptions(seed=3, days=0.6, faults=False, **SMALL))
        gone_at = START + 0.1 * 86_400
        sim.at(gone_at - 1, lambda sim=sim: setattr(sim.manager.own_relay, "on_loss", lambda now: None))
        sim.at(gone_at, sim.own_away, 60.0, float("inf"))
        if again:
            sim.at(gone_at + 3600, sim.own_away, 60.0, 0.0)
        violations = sim.run().violations
        assert ("own_loss_refilled" in violations) is broken, violations


def test_sending_the_own_relay_what_it_lost_is_not_a_busy_loop():
    """The own relay back empty (a relay in memory): every event goes to it again, one
    answer each at least. Seed 6 of the stress mix (4,682 events) spent 5,704 messages in that
    hour, 4,801 of them deliveries refused until the announcements were back, against a
    bound of 4,600 for four relays: the bound now counts what the own relay lost."""
    sim = Simulation(SimOptions(seed=3, days=0.5, faults=False, **SMALL))
    _assert_clean(sim.run())
    checker, held, hour = sim.checker, len(sim.own.store), sim.checker._hour()

    def actions() -> float:
        return checker.hour_actions.get(hour, 0) + checker.hour_actions.get(hour - 1, 0)

    before = actions()
    assert held > 20
    sim.own_away(600.0, float("inf"))
    assert len(sim.own.store) == 0
    sim.own_back()
    assert (actions() - before) * BUSY_PER_ACTION == pytest.approx(BUSY_PER_LOST * held)
    for extra, broken in ((0, False), (1, True)):
        checker.violations.pop("busy_loop", None)
        checker.hour_actions[hour - 1] = 0
        checker.hour_messages[hour] = BUSY_BASE + BUSY_PER_ACTION * actions() + extra  # (gsync stopped: no relays)
        checker.busy(hour)
        assert ("busy_loop" in checker.violations) is broken


def test_a_comment_is_owed_an_hour_after_its_root_reached_the_own_relay():
    """Seed 418's year (left_behind, day 364.9583; the checker's mistake): the own relay
    lost a patch and its comment; a new announcement listed a relay that held the patch, which
    gsync delivered at once, and the comment (found by its root) 9 s later. The hourly check
    fell between the two and owed the comment from the instant its root landed. A comment is
    owed from an hour after its root reached the own relay, as an event is from an hour after
    its publication."""
    sim = Simulation(SimOptions(seed=4, days=1, faults=False, **SMALL))
    sim.seed_world()
    checker, own, world = sim.checker, sim.own, sim.world
    repo = next(r for r in world.repos if any(own.accepts(e)[0] for e in r.roots))
    url = repo.relays[0]
    listing = {repo.address: set(repo.relays)}
    root = world.root(repo, int(sim.clock.now))
    comment = world.comment(repo, root, int(sim.clock.now))
    assert not checker.owed(comment, url, listing)  # its root is not on the own relay
    sim.clock.now += 600
    assert own.submit(root, sim.clock.now)[2]
    assert not checker.owed(comment, url, listing)
    sim.clock.now += 3599
    assert not checker.owed(comment, url, listing)
    sim.clock.now += 1
    assert checker.owed(comment, url, listing)


def test_an_event_is_owed_an_hour_after_its_repository_came_back_to_the_own_relay():
    """Seed 12 of ``--days 10 --req-caps 0.5 --small-pages 0.5 --ignores-until 0.3 --imports
    0.5 --series 0.5 --fault-scale 2`` (left_behind, day 9.25; the checker's mistake): the own
    relay, emptied, lost every announcement of a repository; an older one came back to it 100 s
    before the hourly check, and the patch it had refused meanwhile was fetched again and
    stored 110 s after. An event is owed from an hour after its repository was accepted again,
    as a comment is from an hour after its root."""
    sim = Simulation(SimOptions(seed=4, days=1, faults=False, **SMALL))
    sim.seed_world()
    checker, own, world = sim.checker, sim.own, sim.world
    repo = next(r for r in world.repos if own.lists_us(r.announcement))
    url = repo.relays[0]
    listing = {repo.address: set(repo.relays)}
    root = world.root(repo, int(sim.clock.now))
    own.lose_since(float("-inf"))
    assert not checker.owed(root, url, listing)  # its repository is not on the own relay
    sim.clock.now += 600
    assert own.submit(repo.announcement, sim.clock.now)[2]
    assert not checker.owed(root, url, listing)
    sim.clock.now += 3599
    assert not checker.owed(root, url, listing)
    sim.clock.now += 1
    assert checker.owed(root, url, listing)


def test_a_dead_relays_daily_session_that_served_nothing_within_the_hour_is_a_failure_to_the_checker_too():
    """Seed 444's year (neglected_relay, days 254.17-254.67; the checker's mistake): relay5,
    dead after a day of failed dials, held its daily attempt's session for 160 s, was
    rate-limited in it and served nothing. ``record_disconnect`` counts that a failure (it
    neither served for PROVEN_SESSION_SECS nor lasted the hour of backoff before it): the
    next attempt a day later. The checker excused only a session gone within a minute."""
    sim = Simulation(SimOptions(seed=4, days=1, faults=False, **SMALL))
    checker, url = sim.checker, sim.world.relay_urls[0]
    conn = types.SimpleNamespace(relay=url, number=1, starts=[])

    def daily_session(secs, served):
        checker.long_down_ended.pop(url, None)
        checker.daily_dial[url] = sim.clock.now
        checker.session_changed(url, 1)
        if served:
            checker.relay_frame(conn, json.dumps(["EOSE", "h1-2"]))
        sim.clock.now += secs
        checker.session_changed(url, -1)
        sim.clock.now += 10
        return url in checker.long_down_ended

    assert daily_session(30, served=True)  # gone within a minute: a failure, served or not
    assert daily_session(160, served=False)  # within the hour, nothing served: a failure
    assert not daily_session(160, served=True)  # it served for a minute: the relay works
    assert not daily_session(3700, served=False)  # as long as the backoff before it: no failure


def test_an_id_fetch_cut_off_by_its_connection_ending_is_not_an_ask_to_the_checker():
    """Seed 520's year (unservable_asked_again, day 294.12; the checker's mistake): relay0,
    restarting every few minutes, advertised an id it never serves; gsync's id fetch went
    out a millisecond before the session ended, unanswered, and was sent again on the next
    connection. The checker took back an ask the relay closed unanswered, not one its
    connection's end left unanswered, and counted four asks within a day where the relay
    answered three."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    checker, url = sim.checker, sim.world.relay_urls[0]
    hidden = "ab" * 32
    sessions = []

    def ask(answered: bool) -> None:
        conn = types.SimpleNamespace(relay=url, number=len(sessions) + 1000, starts=[])
        sessions.append(conn)
        checker.session_changed(url, 1)
        sim.clock.now += 30
        checker.client_frame(conn, "REQ", json.dumps(["REQ", "h1-2", {"ids": [hidden]}]))
        if answered:
            checker.relay_frame(conn, json.dumps(["EOSE", "h1-2"]))
        sim.clock.now += 0.001
        checker.session_changed(url, -1, conn)
        sim.clock.now += 600

    def asks(*answered):
        sim.relays[url].hidden.add(hidden)
        checker.hidden_asks.clear()
        checker.violations.pop("unservable_asked_again", None)
        for a in answered:
            ask(a)
        return "unservable_asked_again" in checker.violations

    found = _cases_in_running_world(sim, {
        "cut": lambda: asks(False, True, True, True),  # the first cut off: three asks
        "answered": lambda: asks(True, True, True, True),  # four answered within a day: one too many
    })
    assert found == {"cut": False, "answered": True}


def _cases_in_running_world(sim, cases: dict) -> dict:
    """Each of ``cases`` (name -> a call of no arguments) run in turn a tenth of a day into
    ``sim``'s world, gsync running; what each returned, by name."""
    found = {}

    def run():
        for name, case in cases.items():
            found[name] = case()

    sim.at(START + 0.1 * 86_400, run)
    sim.run()
    return found


def _dead_to_both(sim, days_down: float) -> str:
    """A relay of the running world (up in it), down ``days_down`` to the checker and dead to
    gsync (failing since, its last attempt an hour ago); its dead_dialled breaches so far
    cleared. Its URL."""
    m, now, checker = sim.manager, sim.clock.now, sim.checker
    url = next(iter(m.relays))
    checker.violations.pop("dead_dialled", None)
    checker.down_since[url] = now - days_down * 86_400
    checker.tabled_since[url] = now - (days_down + 1) * 86_400
    checker.dials[url] = [now - 3600]
    m.health.restore(url, {"failures": 60, "first_failure_at": now - days_down * 86_400, "last_failure_at": now - 3600})
    m.health._relays[url].connected = False  # (up in this world: as a dead relay's record says)
    return url


def test_a_dead_relay_retired_and_listed_again_after_a_restart_keeps_its_dead_mark():
    """Seed 618's year (dead_dialled 20 from day 343.0088): relay3, down for a week and dead
    to gsync, kept its dead mark through a kill and restart, was retired by the new process
    and listed again 2 minutes later, its dead mark gone with its state, and dialled with
    backoff anew. (The checker was taught then to count from its return; a retired relay
    keeps its dead mark a day now, ``health.retire``.) The new process keeps it through the
    retirement, and the checker holds it to that: two dials 7 s apart break dead_dialled,
    whether the last sample saw the old record or none of this process did."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    checker = sim.checker

    def dials_after(sampled: bool) -> tuple:
        m, now = sim.manager, sim.clock.now
        url = _dead_to_both(sim, days_down=8)  # down a week
        checker.sighted[url] = (sim.gen - 1, object(), now - 3600)  # the previous process's last attempt
        if sampled:
            checker.bounded()  # a sample sees this process's record of it
        m.health.retire(url, now)  # as ``retire_unwanted_relays`` does
        del m.relays[url]
        m.lifecycle.register_relay(url)
        dead = m.health.is_dead(url, now) and m.health.next_attempt_at(url, now) == now - 3600 + 86_400
        checker.dialled(url)
        sim.clock.now += 7
        checker.dialled(url)
        return dead, "dead_dialled" in checker.violations

    found = _cases_in_running_world(sim, {"sampled": lambda: dials_after(sampled=True),
                                          "unsampled": lambda: dials_after(sampled=False)})
    assert found == {"sampled": (True, True), "unsampled": (True, True)}


def test_a_dead_relay_retired_by_one_process_and_listed_again_by_the_next_is_judged_from_its_return():
    """Seed 80's 60 days (dead_dialled 20 from day 44.79; the checker's mistake): relay5,
    dead a month, retired at day 44.21 with its dead mark kept in memory (``health.retire``);
    gsync was killed 14 hours later, and the next process, its saved rows of relay5 gone
    with the retirement, listed it again at once and dialled it with backoff anew. A retired
    relay's record lives in the process that retired it: the checker counts the dials of a
    relay retired by another process from its return; by the same process, from when it
    went down."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    checker = sim.checker

    def dials_after(new_process: bool) -> bool:
        m, now = sim.manager, sim.clock.now
        url = _dead_to_both(sim, days_down=30)  # down a month
        checker.bounded()  # sighted in the table
        m.health.retire(url, now)
        state = m.relays.pop(url)
        checker.bounded()  # sighted retired, its dead mark kept
        assert url in checker.tabled_since and checker.retired_in[url] == sim.gen
        if new_process:
            sim.gen += 1  # (the next process: nothing of the retired record)
            m.health._retired.clear()
        m.lifecycle.register_relay(url)
        assert m.relays[url] is not state
        checker.dialled(url)
        sim.clock.now += 7
        checker.dialled(url)
        return "dead_dialled" in checker.violations

    found = _cases_in_running_world(sim, {"same": lambda: dials_after(new_process=False),
                                          "next": lambda: dials_after(new_process=True)})
    assert found == {"same": True, "next": False}


def test_an_event_refused_is_offered_again_once_its_rejected_entry_expired(tmp_path):
    """Seed 64's 60 days (left_behind from day 59.04): the own relay, emptied by a restart,
    refused a comment (``blocked:`` its root missing); the root came back seven days later.
    The comment's rejected entry expired meanwhile (REJECTED_COLD_SECS), but its id stayed
    in ``seen``, as if delivered: every copy relay1 sent after was dropped as known. A
    refused event whose entry expired leaves ``seen`` too: the next copy goes to the own
    relay again (``RejectedIndex.expire`` says which left)."""
    h = ManagerHarness(tmp_path)
    owner = Author.named("u0")
    repo = announcement(owner, "r0", relays=[A])
    bug = issue(Author.named("bob"), repo)
    reply = comment(Author.named("alice"), bug)
    h.own_relay_holds(repo, bug)
    h.connect(A)
    sub = next(iter(h.conn(A).subscriptions))
    h.relay_sends(A, sub, reply)
    assert h.manager.delivery.is_tracked(reply.id)
    h.manager.delivery._finish(reply, "rejected", "blocked: not an event of a repository hosted here")
    h.feed(h.manager.queue.get_nowait())  # (the lane's answer: DeliveryAnswered)
    assert reply.id in h.manager.rejected
    h.relay_sends(A, sub, reply)  # a copy while the refusal stands: kept out
    assert not h.manager.delivery.is_tracked(reply.id)
    h.advance(constants.REJECTED_COLD_SECS + constants.MAINTENANCE_TICK_SECS)
    h.tick()
    assert reply.id not in h.manager.rejected  # expired
    h.relay_sends(A, sub, reply)
    assert h.manager.delivery.is_tracked(reply.id)  # offered again


def test_an_event_refused_and_pushed_out_of_a_full_rejected_index_is_still_kept_out(tmp_path):
    """The index holds REJECTED_MAX_ENTRIES; past it the oldest refusal makes room. That
    event stays in ``seen`` (as long as seen holds it): a relay with more refused events than
    the index holds does not have them offered to the own relay at every copy."""
    h = ManagerHarness(tmp_path)
    owner = Author.named("u0")
    repo = announcement(owner, "r0", relays=[A])
    bug = issue(Author.named("bob"), repo)
    h.own_relay_holds(repo, bug)
    h.manager.rejected.max_entries = 1
    h.connect(A)
    sub = next(iter(h.conn(A).subscriptions))
    first, second = (comment(Author.named(name), bug) for name in ("alice", "carol"))
    for reply in (first, second):
        h.relay_sends(A, sub, reply)
        h.manager.delivery._finish(reply, "rejected", "blocked: spam")
        h.feed(h.manager.queue.get_nowait())
    assert first.id not in h.manager.rejected and second.id in h.manager.rejected  # pushed out
    h.relay_sends(A, sub, first)
    assert not h.manager.delivery.is_tracked(first.id)


def test_a_refusal_whose_pause_came_after_the_last_save_is_not_held_against_the_next_process():
    """Seed 169's 60 days (refused_asked_again 3 at day 53.198; the checker's mistake):
    relay5 refused a REQ over #e 0.5 s before a save; gsync tried the REQ's shapes one by
    one and paused #e 4 s after it, and was killed a minute later, before its next save.
    The next process could not know the pause and asked #e in its first REQs. What a killed
    process holds against a relay is what its last save wrote: a refusal it read before that
    save counts on only if the save held its pause."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    checker = sim.checker

    def killed_with(saved_paused: list) -> bool:
        m, now = sim.manager, sim.clock.now
        url = next(iter(m.relays))
        checker.refused_at[url] = {"e": [now - 60, 0]}
        checker.refused_by[(url, "e")] = checker._relay_state(url)
        m.saved._saved_records[url] = {"paused": saved_paused}
        checker.gsync_killed(saved_at=now - 30)  # (the refusal read before that save)
        return "e" in checker.refused_at.get(url, {})

    found = _cases_in_running_world(sim, {"unsaved": lambda: killed_with([]),
                                          "saved": lambda: killed_with([((None, ("e",)), 0)])})
    assert found == {"unsaved": False, "saved": True}


def test_a_dial_in_flight_when_gsync_stopped_is_not_one_the_next_process_knows():
    """Seed 733's year (dead_dialled at day 76.1395; the checker's mistake): relay5, dead,
    had its daily attempt in flight when gsync was stopped (gracefully: its state saved, but
    the attempt's outcome never came); the next process, 43 s later, made it again. A dial
    whose handshake had not ended when gsync stopped is not one the next process can know."""
    sim = Simulation(SimOptions(seed=4, days=0.2, faults=False, **SMALL))
    checker = sim.checker

    def stopped_while(dialling: bool) -> bool:
        m, now = sim.manager, sim.clock.now
        url = _dead_to_both(sim, days_down=30)
        checker.dials[url] = [now - 86_400]  # yesterday's attempt
        checker.dialled(url)  # today's
        if dialling:
            m.relays[url].status = ConnectionStatus.CONNECTING
        checker.gsync_ending()
        m.relays[url].status = ConnectionStatus.DISCONNECTED
        sim.clock.now += 43
        checker.dialled(url)  # the next process's
        return "dead_dialled" in checker.violations

    found = _cases_in_running_world(sim, {"in flight": lambda: stopped_while(dialling=True),
                                          "ended": lambda: stopped_while(dialling=False)})
    assert found == {"in flight": False, "ended": True}
