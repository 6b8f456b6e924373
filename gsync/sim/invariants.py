"""The invariants, checked as the simulation runs: each breach is recorded under its name
with the simulated day it happened and what broke.

- ``forged_accepted`` / ``forged_delivered``: an event whose id or signature does not match
  what its author signed was taken by gsync as checked, or sent to the own relay.
- ``unrequested_accepted``: an event a relay sent on a subscription whose filters it matches
  none of was taken by gsync (from that subscription: its id may name another one later).
- ``left_behind`` (liveness): from 25 simulated hours after the faults stopped, every event
  the own relay would accept that is on an up relay gsync should sync from (bootstrap, or
  listed by an announcement the own relay holds), published more than an hour before (on a
  ``--drops-live`` relay, LIVE_AUDIT_SECS and half an hour: its next live audit), is on
  the own relay (a comment: its root there for an hour too; an announcement: unless older
  than the newest of its repository the running gsync was shown); not on a relay dead to
  gsync in the 26 h before (``neglected_relay``'s leave).
- ``unexplained_pause``: a shape gsync holds paused on a relay (a policy refusal) none of
  whose tags that relay ever refused ``blocked:`` (the one policy simulated relays have): a
  refusal for want of an AUTH the relay takes, or anything else, taken as policy.
- ``notes_misjudged``: gsync holds a relay for one refusing filters that may bring notes
  without naming authors (``precise_refused``: asked without notes for good, saved) that
  does not (AntiSyncBots, ``--anti-sync-bots``): a refusal of a tag that ended before its
  kinds probe, taken for that (seed 4003's year, day 112.09). At each sample.
- ``gate``: two background starts (a historic REQ, a NEG-OPEN) on one connection closer
  than the configured gate.
- ``dial_storm``: more than 30 handshakes to one relay within an hour (3 more for each time
  it went down in that hour); ``dead_dialled``: a
  relay down for more than DEAD_AFTER_SECS + max backoff dialled twice within
  DEAD_RETRY_SECS (less an hour of slack); counted from its first dial since it entered gsync's
  table (a relay retired keeps its dead mark a day, ``health.retire``: one dead when a dial or
  a 10-minute sample last saw it, listed again by the same process within the day, is still
  judged from when it went down; one not dead then, or out longer, or forgotten by a process
  when ready, no repository listing it then (``forgotten``), from its return); a dial a
  killed gsync had not saved yet is not counted (the next process cannot know it), nor one
  whose handshake had not ended when gsync stopped.
- ``relay_table``: a relay in gsync's relay table that no announcement the own relay holds
  lists (and is not bootstrap) for more than an hour (a day after the own relay lost data:
  gsync is not told what it lost), nor the newest announcement of a repository the running
  gsync's self-subscription showed it (one a loss took: gsync keeps the newest announcement
  its self-subscription showed, SPEC §3, until it restarts; seed 1's year, where the one
  relay still holding the repository had an older one, delivered again after the own relay
  lost everything; seed 6's year, where the process running was started after a loss took
  the newest, and was shown the older one);
  ``metric_labels``: a per-relay metric
  series for a relay not in the table; ``table_bound``: seen, rejected, held, recovery, health (retired relays too)
  tables past a bound computed from the world.
- ``neglected_relay``: over a window of NEGLECT_WINDOW_SECS, a relay gsync should sync
  from was up (while gsync ran and it was wanted, as sampled every 10 minutes) for at least
  half the window, and gsync had a session with it for less than a quarter of that time —
  unless it had been down for 20 h or more in the 26 h before (dead: one attempt a day is
  what SPEC asks), or a daily attempt of it (no dial in the 20 h before) failed in the 26 h
  before: the relay down, or its session over within PROVEN_SESSION_SECS (a flapping relay
  stays dead to gsync: seed 6's year, day 313.5). Up time after a failed attempt (a dial,
  or a session over within PROVEN_SESSION_SECS) is not owed until the next dial, up to
  MAX_BACKOFF_SECS and a tick: gsync backs off from such a relay by design (seed 326's year,
  day 201.5: relay1 restarting every few minutes cut three sessions in a row within 35 s).
- ``refused_asked_again``: a tag key a relay refused by policy (CLOSED ``blocked:``; a NOTICE
  alone, which names no REQ, allows two asks more, and any while that relay answers nothing
  with EOSE) asked of
  it again more than twice within POLICY_PROBE_SECS after gsync read the refusal (the
  refused shape asked once without notes, gsync's kinds probe, ``protocol.precise``, once, and
  when the relay served that probe, asked without notes until it refuses it so; an ask of
  it the relay served, EOSE, ends the refusal: not refused any more; an ask
  the relay closed unanswered, rate-limited, too many REQs open or auth-required, is not
  counted: sent again, it is the same ask; a relay
  retired or forgotten meanwhile forgets it, as it does its dead mark: counted from its
  return (a relay out of gsync's table and saved memory at a 10-minute sample); a
  refusal a killed gsync's last save did not hold the pause of (read after it, or its verdict
  came after it) is not counted against the next process, which cannot know it, as
  ``dead_dialled`` does not count unsaved dials; nor is one the process held no pause of
  when it ended: it had no verdict on it yet).
- ``unservable_asked_again``: an id a relay advertises and never serves (the ``hidden``
  fault) asked of it by id more than UNSERVABLE_ASKS times within a day (23 h: gsync's daily
  fresh starts come 23-25 h apart) of one gsync run (once
  at first, once by its recovery; once when another relay found it unservable, after which
  it is unservable here too; its daily fresh start asks again); an ask the relay leaves
  without EOSE (the ``no_eose`` fault) is not counted: the relay did not answer it, nor is
  one it closed unanswered (rate-limited, too many REQs open: sent again, it is the same ask),
  nor one whose connection ended before its answer (the same: seed 520's year); a relay
  retired and listed again by the same process is counted from its return. On a relay that
  ignores ``until``, UNSERVABLE_ASKS_UNTIL_IGNORED: a filter it left unpaged is no witness,
  so an id it did not bring goes to recovery by id rather than being judged unservable.
- ``ids_judged_unserved``: gsync judged a relay not to serve by id what its NIP-77 advertises
  (``RelayState.ids_unserved_at``) while the relay served ids (its ``ids_unserved`` fault
  off for the ten minutes before): the unservable event of one id must cost the relay nothing.
  Unless its REQs by id of those ten minutes asked 20 ids or more and it served at most a
  tenth (the others hidden): the seed's count, which gsync follows where filters are no witness.
- ``polled_with_room``: a connected relay whose live coverage is polled (what its pauses
  allow) beside a free live slot, outside historic sync, with no capacity refusal this
  session and on a relay that keeps live REQs (not one closing each after its EOSE), at
  every 10-minute sample for over POLLED_CONSOLIDATION_CHECK_SECS and 20 minutes: a REQ every few seconds where a live subscription fits (seed 74's 60 days, day
  47.01: two filters every 6.2 s for 14 hours beside two free slots; ``LiveCoverage.bring_live``).
- ``subscription_cap_low``: gsync holds (learnt from the relay's "too many concurrent REQs",
  kept across restarts) a subscription cap lower than the relay's (a refusal comes when
  as many are open as it holds, so what was open then is its cap): its live coverage past the learnt cap is polled for good (seed 2 of 6 relays and 20
  repositories: a refusal read after a consolidation had closed several took the 5 left
  for the cap where the relay held 10; 15,364 polls in a day and a half).
- ``precise_misjudged``: gsync marked a relay (saved) as answering only precise queries
  while it answers every query (``--rs-software``: nostr-rs-relay without ``limit_scrapers``,
  its default): its tag filters then ask NIP-34's kinds only and its layer 1 the owners'
  announcements only, a maintainer's not.
- ``until_misjudged``: a connection took its relay for one ignoring ``until``
  (``PageCap.until_ignored``) while it reads it as NIP-01 says: its filters are then not paged
  past their first page (seed 1601 of ``--slow-unbounded 0.4``: one unrequested event of a
  relay's junk did it, and what the own relay lost was not refilled from there).
- ``subscriptions_past_cap``: a REQ left more open on a connection than the cap gsync holds
  for that relay (published, assumed or learnt: its session's limits), those the relay
  closed already aside. The relay refuses it, and a refusal read as the cap teaches one too
  low (seed 923 of a 15-day world of twelve relays: live coverage opened into slots historic
  REQs still held, 22 open under a cap of 20; ``LiveCoverage.open_groups``).
- ``live_missed_falsely``: an hourly live audit (``LiveCoverage.run_audits``) judged events
  missed by live subscriptions (``gsync_live_events_missed_total`` rose) on a relay that
  keeps them (all but ``--drops-live``'s), so a false verdict, which reopens every live subscription
  of the relay (seed 2 of 6 relays and 20 repositories: announcements of repositories not
  listing us, dropped as not ours when they came live, were taken as never had).
- ``illegal_status_move``: a status move ``sync.status`` has no row for.
- ``busy_loop``: more manager messages (ticks apart) in a simulated hour than the bound
  ``BUSY_BASE + BUSY_PER_RELAY * relays + BUSY_PER_ACTION * actions`` (actions: publications
  and faults in that hour, those of the hour before too; the own relay back from a loss
  counts ``BUSY_PER_LOST`` messages for each event it lost: all of them go to it again).
- ``own_loss_refilled``: ``REFILL_SECS`` (6 h) after the own relay came back without events
  it had stored, gsync running throughout, an event among them that a relay gsync syncs holds
  and owes (as ``left_behind`` judges) is not on it again; not judged when the own relay was
  away, full, read-only or limiting writes again since, or gsync started or stopped.
- ``handler_raised``: a manager handler raised (production logs it and goes on).
- ``simulator_raised`` (``bench/simulate``): the run itself raised; that seed fails with its
  replay command, the others run on.
"""
from __future__ import annotations

import json
from bisect import bisect_left
from collections import deque
from operator import itemgetter

from .. import constants
from ..io.inbox import OwnEvents, RemoteEvents
from ..io.manager.lifecycle import LAYER1_LIVE_SUB
from ..io.manager.live import LIVE_SUB_PREFIX, live_groups_with_room
from ..io.manager.refusals import ImpreciseCheck, KindsProbe
from ..ops import metrics
from ..protocol.precise import NOTES_EXCLUDED
from ..sync.filter_plan import SubscriptionBudget
from ..sync.policy import describe
from ..sync.relay_state import ConnectionStatus
from ..sync.repos import owner_of
from .relay import all_values, filter_from_json
from .world import DAY, DOMAIN, START

_NOTES_EXCLUDED = sorted(NOTES_EXCLUDED)  # a kinds probe's kinds, as its REQ writes them
_KINDS_PROBED = ("kinds probe",)  # marks a refused tag key's entry: its kinds probe was seen
_PRECISE_SERVED = ("kinds probe served",)  # marks it: that probe was served (EOSE)
# live REQs (``LiveCoverage``'s ids): not paced starts, whatever their filters (a relay known to
# drop ``limit: 0`` is sent them with ``since``: ``filter_plan.live_since``)
_LIVE_REQS = (f'["REQ","{LIVE_SUB_PREFIX}', f'["REQ","{LAYER1_LIVE_SUB}"')

HOUR = 3600.0
KEEP_PER_INVARIANT = 20
UNSERVABLE_ASKS = 3  # asks by id of an id never served, within a day of one gsync run
UNSERVABLE_ASKS_UNTIL_IGNORED = 8  # ... on a relay ignoring until (its filters are no witness)
BUSY_BASE = 3000
BUSY_PER_RELAY = 400
BUSY_PER_ACTION = 200
# what an event the own relay lost may cost once it is back: its delivery's answer, the
# self-subscription's echo, a copy fetched again (seed 6 of the stress mix: back empty, 4,682
# events, its first hour 5,704 messages, 4,801 of them deliveries refused until the
# announcements were back)
BUSY_PER_LOST = 3
# what the own relay lost, back while gsync runs, is on it again this much later
# (``own_loss_refilled``; ``sync.own_witness``)
REFILL_SECS = 6 * HOUR
NEGLECT_WINDOW_SECS = 4 * HOUR
# gsync's /metrics scraped every 2 simulated hours: a series it leaks stays and is found at
# any later sample (the label check runs at every sample), and a scrape with hundreds of
# repositories cost more than the rest of a sample (every 30 minutes: 2.75 % of a year of
# 20 x 200)
SCRAPE_SECS = 2 * 60 * 60
# after a failed attempt, gsync's next one comes within its backoff's cap (and a tick)
BACKOFF_LEAVE_SECS = constants.MAX_BACKOFF_SECS + 600


class Checker:
    def __init__(self, sim):
        self.sim = sim
        self.violations: dict[str, list] = {}
        self.counts: dict[str, int] = {}
        self.served: set[str] = set()  # ids relays sent gsync on a subscription they matched
        # (relay, gsync process, session, sub id, event id) sent unasked (sub ids are
        # used again by later sessions and processes: seed 10's year, day 317.33)
        self.unrequested: set[tuple] = set()
        self.published_at: dict[str, float] = {}
        self.dials: dict[str, list[float]] = {}
        self.downs: dict[str, list[float]] = {}  # when each relay went down, the last hour
        self.down_since: dict[str, float] = {}
        self.down_spans: dict[str, deque[tuple[float, float]]] = {}  # (outages ended in the last 26 h)
        self.down_total: dict[str, float] = {}  # relay -> the summed length of its down_spans
        # relay -> (process, gsync's record of it, when) at its last dial or sample
        self.sighted: dict[str, tuple] = {}
        # relay -> the process a sample found it retired by, its dead mark kept (in memory)
        self.retired_in: dict[str, int] = {}
        self.unwanted_since: dict[str, float] = {}
        self.hour_messages: dict[int, int] = {}
        self.hour_actions: dict[int, int] = {}
        self.max_hour_messages = 0
        self.max_hour_detail = ""
        self.hour_types: dict[str, int] = {}
        self.liveness_checks = 0
        self.left_behind_max = 0
        self.labelled = None  # the per-relay metrics, with their "relay" label's place
        # per relay: [last accounted, seconds up while gsync ran, of which with a session]
        self.uptime: dict[str, list] = {}
        self.sessions_open: dict[str, int] = {}
        # relay -> when it last came back from 20 h down, or a daily attempt of it failed
        # (dead to gsync: its next attempt is a day later; ``neglect``)
        self.long_down_ended: dict[str, float] = {}
        self.daily_dial: dict[str, float] = {}  # relay -> its last dial, where none came in the 20 h before
        self.session_opened: dict[str, float] = {}  # relay -> when its open sessions began
        self.session_served: set[str] = set()  # relays whose open sessions sent an EOSE or an event
        # relay -> since when gsync has had no session of it after an attempt that failed
        # (its dial, or a session over within PROVEN_SESSION_SECS): its backoff (``neglect``)
        self.failing_since: dict[str, float] = {}
        self.own_lost_at = float("-inf")  # the own relay's last loss of data
        self.own_away_at = float("-inf")  # ... and its last time away
        self.started_at = float("-inf")  # gsync's last start (or stop)
        # the running process's first read of the own relay (``own_read``): when it looks for
        # what the own relay lost (``lifecycle.look_for_lost``)
        self.first_read_at = float("-inf")
        self.refused_at: dict[str, dict[str, list]] = {}  # relay -> tag key -> [read at, asked since, ...]
        # relay -> every tag key it ever refused by policy (what explains a shape gsync holds paused)
        self.ever_refused: dict[str, set[str]] = {}
        self._probe_found: dict[str, tuple[float, bool]] = {}  # relay -> (checked at, ``_probe_finds``)
        self.refused_by: dict[tuple[str, str], tuple] = {}  # (relay, tag key) -> _relay_state when read (or reset)
        self.hidden_asks: dict[tuple[str, str], tuple] = {}  # (relay, hidden id) -> (gsync's record of it, asked by id at)
        self.ids_judged: dict[str, float] = {}  # relay -> the ids_unserved_at last checked
        # relay -> (asked at, ids asked, of them hidden) of its latest REQs by id (``ids_judgements``)
        self.id_asks: dict[str, deque] = {}
        self.cap_reported: dict[str, int] = {}  # relay -> the low cap reported (once a value)
        self.precise_reported: set[str] = set()  # relays reported as ``precise_misjudged`` (once each)
        self.until_reported: set = set()  # (relay, session) reported as ``until_misjudged`` (once each)
        # gsync_live_events_missed_total by relay (process-wide: several runs share it) at the last sample
        self.missed_live = _missed_live()
        self.polled_room_since: dict[str, float] = {}  # relay -> first sample it polled beside room
        self.scraped_at = float("-inf")  # the last scrape of gsync's metrics (``bounded``)
        self.tabled_since: dict[str, float] = {}  # relay -> its first dial since it (re)entered the table
        self.gsync_since = START  # when the running gsync started
        self.unsaved_dials: dict[str, list[float]] = {}  # dials a killed gsync had not saved
        self._announced = {}
        # address -> (created_at, id) of the newest announcement the running gsync's
        # self-subscription showed it (what its relay table follows: ``wanted_relays``)
        self.shown: dict[str, tuple[int, str]] = {}

    # -- recording ------------------------------------------------------------------------

    def keeps_live(self, url: str) -> bool:
        """Does relay ``url`` keep live subscriptions (not ``--drops-live``'s)?"""
        relay = self.sim.relays.get(url)
        return relay is None or not relay.drops_live

    def violation(self, name: str, text: str, detail: str = "") -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
        kept = self.violations.setdefault(name, [])
        if len(kept) < KEEP_PER_INVARIANT:
            day = (self.sim.clock.now - START) / DAY
            kept.append((round(day, 4), text, detail))

    def summary(self) -> dict:
        return {"violations": dict(self.counts), "liveness_checks": self.liveness_checks,
                "max_hour_messages": self.max_hour_messages,
                "max_hour": self.max_hour_detail, "faults": dict(self.sim.faults.counts),
                "restarts": self.sim.restarts, "own_events": len(self.sim.own.store),
                "world_events": len(self.sim.world.events)}

    def _hour(self) -> int:
        return int((self.sim.clock.now - START) // HOUR)

    def action(self, weight: float = 1) -> None:
        h = self._hour()
        self.hour_actions[h] = self.hour_actions.get(h, 0) + weight

    def own_back(self, lost: int) -> None:
        """The own relay is back without ``lost`` events it had stored: gsync sends them again."""
        self.action(lost * BUSY_PER_LOST / BUSY_PER_ACTION)

    def published(self, event, urls) -> None:
        self.published_at.setdefault(event.id, self.sim.clock.now)
        self.action()

    def gsync_started(self) -> None:
        self.action()
        self.gsync_since = self.sim.clock.now
        self.hidden_asks.clear()  # a new process: what it marked unservable is gone with the last
        self.shown.clear()  # and the announcements the last one was shown

    def gsync_ending(self) -> None:
        """gsync stopped or killed: a refusal it read and holds no pause of (no verdict yet:
        the REQ it split to find the refused shape unanswered) goes with it; the next process
        cannot know it, and its own read opens the probe period anew (seed 82's year, day
        47.97: relay1 refused #e; the trial of #e alone was closed "too many concurrent
        REQs" for 16 minutes, then gsync was killed, its saves since the refusal with no pause
        to write; the next process's first REQs asked #e packed, counted as asks 2 to 6 of
        the refusal the last one read). What it paused is
        judged on: a restart restores it (unless killed before a save: ``gsync_killed``).
        And a dial whose handshake had not ended is not one the next process can know of,
        stopped gracefully or not: its outcome was never recorded (seed 733's year, day
        76.139: relay5's daily attempt in flight when gsync was stopped; the next process,
        43 s later, made it again)."""
        self._keep_paused(self._paused_tags)
        m = self.sim.manager
        for url, state in m.relays.items():
            if state.status is ConnectionStatus.CONNECTING and self.dials.get(url):
                self.unsaved_dials.setdefault(url, []).append(self.dials[url][-1])

    def _keep_paused(self, paused_tags) -> None:
        """Forget the refusals whose tag ``paused_tags(url)`` does not name."""
        for url, refused in list(self.refused_at.items()):
            paused = paused_tags(url)
            for key in [key for key in refused if key not in paused]:
                del refused[key]
                self.refused_by.pop((url, key), None)
            if not refused:
                del self.refused_at[url]

    def _paused_tags(self, url: str) -> set[str]:
        """The tag names of the shapes the running gsync holds paused on ``url`` (or in the
        saved memory it has not restored yet: the relay not registered)."""
        m = self.sim.manager
        state = m.relays.get(url)
        if state is not None:
            return {name for key in state.paused.keys() for name in key[1]}
        return self._saved_paused_tags(url)

    def _saved_paused_tags(self, url: str) -> set[str]:
        """The tag names of the shapes paused on ``url`` in what gsync last wrote of it (or
        read of it at its start and has not registered since)."""
        saved = self.sim.manager.saved
        record = saved._saved_records.get(url) or saved._memories.get(url) or {}
        return {name for key, *_ in record.get("paused") or () for name in key[1]}

    def gsync_killed(self, saved_at: float | None) -> None:
        """gsync killed: the dials since its last save (every STATE_SAVE_SECS in production,
        at the simulator's ticks here) are lost with it; the next process cannot know them
        (dead_dialled does not count them; seed 2's year, day 228.52: killed 54 s after a
        dead relay's daily attempt, the next process made it again)."""
        cut = max(saved_at if saved_at is not None else self.gsync_since, self.gsync_since)
        for url, times in self.dials.items():
            unsaved = [t for t in times if t > cut]
            if unsaved:
                self.unsaved_dials.setdefault(url, []).extend(unsaved)
        # and so are the refusals it read since: the next process asks again what it cannot
        # know was refused (seed 1's year, day 222.78: relay1's #e refusal read between two
        # idle ticks, gsync killed 288 s later, before the next tick saved the pause); its
        # own read of the refusal opens the probe period anew
        self._drop_refusals(lambda url, read_at: read_at > cut)
        # and a pause decided after that save, though the refusal was read before it: the
        # refused REQ's shapes tried one by one first (seed 169's 60 days, day 53.198:
        # relay5's #e refusal read 0.5 s before a save, its verdict 4 s after; killed a
        # minute later, the next process asked #e three times in its first REQs)
        self._keep_paused(self._saved_paused_tags)

    def relay_went_down(self, url: str) -> None:
        self.account(url)
        self.downs.setdefault(url, []).append(self.sim.clock.now)
        self.down_since.setdefault(url, self.sim.clock.now)
        self.action()

    def relay_came_up(self, url: str) -> None:
        """Back up: down 20 h or more of the 26 h before (one outage or several: seed 313's
        year, day 9.5, 14.6 h and 18.2 h with 38 minutes up between, all gsync's hourly dials
        failed) makes it dead to gsync, one attempt a day (``neglect``)."""
        self.account(url)
        now = self.sim.clock.now
        since = self.down_since.pop(url, None)
        if since is None:
            self.action()
            return
        # The time down within the 26 h: the outages' summed length, kept as they come and
        # go (summed at every come-up, it was quadratic in a relay restarting every few
        # minutes), less the part of the oldest before the 26 h (outages are one after
        # another: only the oldest can begin before). Within a second of the bound, summed
        # as it always was, so that no rounding of the running total can move a judgement.
        spans = self.down_spans.setdefault(url, deque())
        spans.append((since, now))
        total = self.down_total.get(url, 0.0) + (now - since)
        while spans and now - spans[0][1] >= 26 * HOUR:
            start, end = spans.popleft()  # (bounded: the outages of the last 26 h)
            total -= end - start
        self.down_total[url] = total
        down = total - max(0.0, now - 26 * HOUR - spans[0][0])
        if abs(down - 20 * HOUR) < 1.0:
            down = sum(end - max(start, now - 26 * HOUR) for start, end in spans)
        if down >= 20 * HOUR:
            self.long_down_ended[url] = now
        self.action()

    def session_changed(self, url: str, delta: int, conn=None) -> None:
        """A session of ``url`` opened (+1) or ended (-1, ``conn`` the connection that
        ended): what it asked of hidden ids and never had answered is taken back, as a REQ
        closed unanswered is (``_id_ask_answered``): sent again on the next connection, it
        is the same ask (seed 520's year, day 293.156: relay0 restarting every few minutes,
        an id fetch cut 1 ms after it was sent, counted as a fourth ask within a day)."""
        if conn is not None:
            for answered in conn.__dict__.pop("id_asks", {}).values():
                for times, at in answered:
                    if at in times:
                        times.remove(at)
        self.account(url)
        now, was = self.sim.clock.now, self.sessions_open.get(url, 0)
        self.sessions_open[url] = was + delta
        if delta > 0 and not was:
            self.session_opened[url] = now
            self.session_served.discard(url)
            self.failing_since.pop(url, None)
        elif delta < 0 and was == 1:
            opened, daily = self.session_opened.pop(url, now), self.daily_dial.get(url)
            lasted, served = now - opened, url in self.session_served
            self.session_served.discard(url)
            if lasted < constants.PROVEN_SESSION_SECS:
                self.failing_since[url] = now  # a failure to gsync: it backs off (seed 326)
            if daily is not None and opened - daily < HOUR and (
                    lasted < constants.PROVEN_SESSION_SECS or (not served and lasted < constants.MAX_BACKOFF_SECS)):
                # a dead relay's daily attempt, its session gone within a minute, or within
                # the hour of backoff before it having served nothing: a failure
                # (``RelayHealthTracker.record_disconnect``), the next attempt a day later
                # (seed 6's year, day 313.16: a flapping relay, 5 neglected_relay; seed 444's,
                # day 253.68: a session of 160 s, rate-limited, 4 neglected_relay)
                self.long_down_ended[url] = now

    def account(self, url: str) -> None:
        """Up time and session time of ``url`` up to now (before either changes). Up time
        gsync spends in its backoff after a failed attempt, up to MAX_BACKOFF_SECS (and its
        tick), is not owed a session: a relay whose sessions end within PROVEN_SESSION_SECS
        is failing to gsync, by design (``RelayHealthTracker.record_disconnect``)."""
        now = self.sim.clock.now
        entry = self.uptime.setdefault(url, [now, 0.0, 0.0])
        relay = self.sim.relays.get(url)
        if relay is not None and relay.up and self.sim.manager is not None:
            since = self.failing_since.get(url)
            excused = 0.0 if since is None else max(0.0, min(now, since + BACKOFF_LEAVE_SECS) - max(entry[0], since))
            entry[1] += now - entry[0] - excused
            if self.sessions_open.get(url, 0) > 0:
                entry[2] += now - entry[0]
        entry[0] = now

    def neglect(self) -> None:
        now = self.sim.clock.now
        owed = self.owed_relays()
        for url in sorted(self.uptime):
            self.account(url)
            _, up, with_session = self.uptime[url]
            self.uptime[url] = [now, 0.0, 0.0]
            if url not in owed or up < NEGLECT_WINDOW_SECS / 2:
                continue
            if now - self.long_down_ended.get(url, float("-inf")) < 26 * HOUR + NEGLECT_WINDOW_SECS:
                continue
            if with_session < up / 4:
                self.violation("neglected_relay", f"{url}: up {up / HOUR:.1f} h of the last {NEGLECT_WINDOW_SECS / HOUR:.0f}, "
                                                  f"in session {with_session / HOUR:.2f} h")

    def own_read(self) -> None:
        """The self-subscription read the own relay (its history posted to gsync)."""
        if self.first_read_at < self.started_at:
            self.first_read_at = self.sim.clock.now

    def gsync_started_or_stopped(self) -> None:
        self.started_at = self.sim.clock.now
        for url in sorted(self.uptime):
            self.account(url)

    # -- per step -------------------------------------------------------------------------

    def message(self, msg, name: str = "") -> None:
        name = name or type(msg).__name__
        if name != "Tick":
            h = int((self.sim.clock.now - START) // HOUR)
            self.hour_messages[h] = self.hour_messages.get(h, 0) + 1
            self.hour_types[name] = self.hour_types.get(name, 0) + 1
        if type(msg) is OwnEvents:
            shown = self.shown
            for e in msg.events:
                if e.kind == 30617:
                    at, newest_id = shown.get(e.address, (-1, ""))
                    if e.created_at > at or (e.created_at == at and e.id < newest_id):
                        shown[e.address] = (e.created_at, e.id)
        elif type(msg) is RemoteEvents:
            world = self.sim.world.events
            for e in msg.events:
                genuine = world.get(e.event.id)
                if e.verified and (genuine is None or genuine.sig != e.event.sig
                                   or genuine.content != e.event.content or genuine.tags != e.event.tags):
                    self.violation("forged_accepted", f"{e.relay} {e.event.id[:16]}")
                if (e.relay, self.sim.gen, e.session, e.sub_id, e.event.id) in self.unrequested:
                    self.violation("unrequested_accepted", f"{e.relay} {e.sub_id} {e.event.id[:16]}")

    def delivered(self, event) -> None:
        genuine = self.sim.world.events.get(event.id)
        if genuine is None or genuine.sig != event.sig or genuine.content != event.content:
            self.violation("forged_delivered", event.id[:16])

    def client_frame(self, conn, verb: str, text: str) -> None:
        if verb == "NEG-OPEN":
            self._start(conn, text)
        elif (verb == "REQ" and '"limit":0' not in (text.replace(" ", "") if " " in text else text)
              and not text.startswith(_LIVE_REQS)):  # (a live REQ sent with ``since``: no start)
            self._start(conn, text)
        if verb == "REQ":
            self._within_cap(conn)
        relay = self.sim.relays[conn.relay]
        if verb == "REQ" and relay.hidden and not relay.no_eose and '"ids"' in text:
            # (a REQ the relay leaves without EOSE is not answered: asked again, it is a fetch
            # that never ended retried, not an id it said it does not serve asked again)
            self._asks_hidden(conn, text)
        if verb in ("REQ", "NEG-OPEN") and conn.relay in self.refused_at:
            self._asks_refused(conn, text if verb == "REQ" else "[\"REQ\"," + text.split(",", 1)[1])

    def _within_cap(self, conn) -> None:
        """``subscriptions_past_cap``, once a connection."""
        state, book = self.sim.manager.relays.get(conn.relay), getattr(conn, "book", None)
        if state is None or book is None or state.current.book is not book or conn.__dict__.get("past_cap"):
            return  # (the checker's own tests hand it frames without a connection's book)
        open_now = book.held_by_relay()
        cap = SubscriptionBudget.from_limits(state.current.limits).max_subscriptions
        if open_now > cap:
            conn.__dict__["past_cap"] = True
            self.violation("subscriptions_past_cap", f"{conn.relay}: {open_now} open, its cap {cap}")

    def _asks_hidden(self, conn, text: str) -> None:
        url = conn.relay
        hidden = self.sim.relays[url].hidden
        try:
            msg = json.loads(text)
            filters = msg[2:]
        except ValueError:
            return
        now = self.sim.clock.now
        every = {i for f in filters if isinstance(f, dict) for i in f.get("ids") or ()}
        asked = {i for i in every if i in hidden}
        if asked:
            asked -= self._beyond_cut(self.sim.relays[url], filters, asked)
        self.id_asks.setdefault(url, deque(maxlen=64)).append((now, len(every), len(asked)))
        record = self._relay_state(url)[1]
        for event_id in sorted(asked):
            held = self.hidden_asks.get((url, event_id))
            if held is None or held[0] is not record:
                # first asked, or the relay retired and listed again since, by this gsync
                # process: what it marked unservable there went with it (as its refusals and
                # dead mark do); its asks count from its return (seed 52's year, day 98.91)
                held = self.hidden_asks[(url, event_id)] = (record, [])
            times = held[1]
            times.append(now)
            # (a relay ignoring until: its filters' pages stop at the first, no witness that it
            # does not serve an id, which goes to recovery by id instead: a few asks more)
            budget = UNSERVABLE_ASKS_UNTIL_IGNORED if self.sim.relays[url].ignores_until else UNSERVABLE_ASKS
            del times[:-budget - 1]
            # (until the relay answers it: one it closes unanswered is taken back, ``relay_frame``)
            conn.__dict__.setdefault("id_asks", {}).setdefault(msg[1], []).append((times, now))
            # (a day as gsync counts it: its daily fresh starts come 23-25 h apart, and each asks
            # once more; two of them 23.1 h apart, the first 5 minutes after the id was first
            # asked and retried, are four asks within 24 h: seed 84 of --fault-scale 3)
            if len(times) > budget and now - times[0] < constants.DAILY_MIN_SECS:
                self.violation("unservable_asked_again", f"{url}: {event_id[:16]} asked by id {len(times)} times "
                               f"in {(now - times[0]) / HOUR:.1f} h")

    @staticmethod
    def _beyond_cut(relay, filters: list, asked: set[str]) -> set[str]:
        """Of ``asked`` (hidden ids of a REQ), those the relay's answer never reaches: it
        serves each filter newest first up to its page cap (and a whole REQ up to its REQ
        cap), so one older than the last event a cut answer sends was never looked at, and
        the ask says nothing of it (seed 22 of ``--relays 10 --repos 60 --small-pages 0.4``,
        day 7.04: a relay serving 20 a filter was asked 47 ids in one filter, the session
        ended, and the next asked 37 in one filter and the 17 it did not send: a hidden id
        among them counted as asked three times in two minutes). Asks that reach it count."""
        store, events = relay.store, relay.store.events
        beyond: set[str] = set()
        parsed = []
        for obj in filters:
            if not isinstance(obj, dict):
                continue
            try:
                parsed.append(flt := filter_from_json(obj))
            except ValueError:
                continue
            here = asked.intersection(flt.ids or ())
            if not here:
                continue
            served = store.query(relay.as_read(flt), relay.page_cap, relay.hidden)
            if relay.page_cap is not None and len(served) >= relay.page_cap:
                oldest = served[-1].created_at
                beyond |= {i for i in here if i in events and events[i].created_at < oldest}
        if relay.req_cap is not None and parsed and not relay.per_filter:  # (per filter: counted)
            answer = relay.answer(parsed)
            if len(answer) >= relay.req_cap:
                oldest = min(e.created_at for e in answer)
                beyond |= {i for i in asked if i in events and events[i].created_at < oldest}
        return beyond

    @staticmethod
    def _id_ask_answered(asks: dict, frame: str) -> None:
        """An EOSE or CLOSED of a REQ that asked hidden ids (``asks``: the connection's, by
        sub id). Closed, the relay did not answer it (rate-limited, too many REQs open,
        auth-required): gsync sending it again once the cooldown allows is the same ask, not
        an id the relay said it does not serve asked again; it is taken back from the count
        (seed 77's year, day 306.01: relay3 rate-limited a recovery's id fetch, and its three
        sends a cooldown apart were counted as asks 2 to 4 within a day)."""
        try:
            verb, sub_id = json.loads(frame)[:2]
            answered = asks.pop(sub_id, ())
        except (ValueError, TypeError):
            return
        for times, at in answered:
            if verb == "CLOSED" and at in times:
                times.remove(at)

    def ids_judgements(self) -> None:
        m = self.sim.manager
        if m is None:
            return
        for url, state in m.relays.items():
            at = state.ids_unserved_at
            relay = self.sim.relays.get(url)
            if at is None or relay is None or self.ids_judged.get(url) == at:
                continue
            self.ids_judged[url] = at
            if self._looked_unserving(url, at):
                continue
            if not any(start <= at and at - end < 600 for start, end in relay.ids_unserved_spans):
                self.violation("ids_judged_unserved", f"{url}: judged at day {(at - START) / DAY:.3f} not to "
                               "serve ids, while it served them")

    def _looked_unserving(self, url: str, at: float) -> bool:
        """Did the relay's REQs by id of the ten minutes before ``at`` ask at least
        ``IDS_NOT_SERVED_MIN_ADVERTISED`` ids and serve at most a tenth (the others hidden)?
        Then the seed's count allows the judgement, filters no witness or not (seed 769 of
        the stress mix: 23 of 24 advertised ids hidden on a relay ignoring until)."""
        recent = [(n, h) for t, n, h in self.id_asks.get(url, ()) if at - 600 <= t <= at]
        asked = sum(n for n, _ in recent)
        served = asked - sum(h for _, h in recent)
        return (asked >= constants.IDS_NOT_SERVED_MIN_ADVERTISED
                and served <= asked * constants.RESIDUAL_FALLBACK_MAX_FRACTION)

    def _start(self, conn, text: str) -> None:
        gate = self.sim.manager.config.sync.background_start_interval_ms / 1000
        sub_id = text.split(",", 2)[1]
        started = conn.__dict__.setdefault("started_subs", set())
        if sub_id in started:
            return  # the same REQ again (after AUTH): not a new start
        started.add(sub_id)  # (added to, not copied: a long session's starts were quadratic)
        now = self.sim.clock.now
        deferred = getattr(conn, "neg_started_at", None)
        if deferred is not None and text.startswith('["NEG-OPEN"'):
            # an exchange that waited for a relay to read our AUTH (``Simulation.exchange``):
            # gsync started it when it spawned it, which is what its gate spaced
            near = [t for t in conn.starts if abs(deferred - t) < gate - 1e-3]
            if near:
                self.violation("gate", f"{conn.relay} {abs(deferred - near[-1]):.3f}s from another start: {text[:120]}")
            conn.starts.append(deferred)
            conn.starts.sort()
            del conn.starts[:-2]
            return
        if conn.starts and now - conn.starts[-1] < gate - 1e-3:
            self.violation("gate", f"{conn.relay} {now - conn.starts[-1]:.3f}s after the last start: {text[:120]}")
        conn.starts.append(now)
        del conn.starts[:-2]

    def relay_frame(self, conn, frame: str) -> None:
        """A frame gsync reads: a policy refusal opens that tag key's probe period; a REQ of
        hidden ids the relay closed unanswered was no ask (``_id_ask_answered``)."""
        if frame.startswith(('["EOSE"', '["EVENT"')):
            self.session_served.add(conn.relay)  # (``RelayHealthTracker.record_served``)
        asks = conn.__dict__.get("id_asks")
        if asks and frame.startswith(('["CLOSED"', '["EOSE"')):
            self._id_ask_answered(asks, frame)
        asked = conn.__dict__.get("refused_asks")
        if asked and frame.startswith(('["CLOSED"', '["EOSE"')):
            self._refused_ask_answered(conn, asked, frame)
        probes = conn.__dict__.get("kinds_probes")
        if probes and frame.startswith(('["CLOSED"', '["EOSE"')):
            self._kinds_probe_answered(probes, frame)
        if frame.startswith(('["CLOSED"', '["NOTICE"')) and '"blocked: #' in frame:  # (--notice-refusals)
            key = frame.split('"blocked: #', 1)[1][:1]
            now = self.sim.clock.now
            self.ever_refused.setdefault(conn.relay, set()).add(key)
            refused = self.refused_at.setdefault(conn.relay, {})
            started = refused.get(key)
            if started is not None and _PRECISE_SERVED in started[2:]:
                started.remove(_PRECISE_SERVED)  # asked without notes, refused all the same
            if started is None or now - started[0] >= constants.POLICY_PROBE_SECS:
                # (a NOTICE names no REQ: gsync finds the shape by asking it alone, after the
                # REQ's stall where the NOTICE could be another REQ's: two asks more)
                alone = frame.startswith('["NOTICE"') and len(json.loads(frame)) == 2  # (one naming its REQ: as a CLOSED)
                refused[key] = [now, -2 if alone else 0]
                self.refused_by[(conn.relay, key)] = self._relay_state(conn.relay)

    def _asks_refused(self, conn, text: str) -> None:
        relay = self.sim.relays.get(conn.relay)
        if relay is not None and relay.notice_refusals and relay.no_eose:
            return  # (its refusals name no REQ and nothing is answered: no NOTICE can be told whose)
        now = self.sim.clock.now
        refused = self.refused_at[conn.relay]
        keys = [k for k, entry in refused.items() if now - entry[0] < constants.POLICY_PROBE_SECS]
        if not keys:
            return
        if "\\" not in text and not any(f'"#{key}"' in text for key in keys):
            return  # (a filter uses a tag key only where its name is in the frame as JSON writes it, or escaped)
        msg = json.loads(text)
        used = {name[1:] for f in msg[2:] if isinstance(f, dict) for name in f if name.startswith("#")}
        for key in keys:
            if key in used:
                entry = refused[key]
                (gen, record), current = self.refused_by[(conn.relay, key)], self._relay_state(conn.relay)
                if record is not current[1]:
                    if gen == current[0]:
                        # retired and listed again since, by this gsync process: its refusals
                        # went with it (as its dead mark does); its asks count from its return
                        entry[1:] = [0]
                    self.refused_by[(conn.relay, key)] = current  # (a restart restores them: counted on)
                if (conn.number, msg[1]) in entry[2:]:
                    continue  # the same REQ sent again (after AUTH): one ask
                precise = all(f.get("kinds") == _NOTES_EXCLUDED
                              for f in msg[2:] if isinstance(f, dict) and f"#{key}" in f)
                if precise and _PRECISE_SERVED in entry[2:]:
                    continue  # its kinds probe was served: asked without notes, it is served
                if _KINDS_PROBED not in entry[2:] and precise:
                    # the refused shape asked once more without notes: was the refusal about
                    # them (``protocol.precise``, khatru's AntiSyncBots)? One ask more, once
                    entry += [_KINDS_PROBED, (conn.number, msg[1])]
                    conn.__dict__.setdefault("kinds_probes", {})[msg[1]] = entry
                    continue
                entry.append((conn.number, msg[1]))
                entry[1] += 1
                conn.__dict__.setdefault("refused_asks", {}).setdefault(msg[1], []).append(entry)
                if entry[1] > 2:
                    self.violation("refused_asked_again", f"{conn.relay} #{key} asked {entry[1]} times "
                                   f"{(now - entry[0]) / HOUR:.1f} h after its refusal: {text[:100]}")

    @staticmethod
    def _kinds_probe_answered(probes: dict, frame: str) -> None:
        """An EOSE or CLOSED of a refused tag key's kinds probe (``probes``: the connection's,
        by sub id). Served (EOSE), the refusal was of the notes the shape may bring, as gsync
        concludes (``Refusals.kinds_probe_answered``): asked without notes from then on, the
        shape is not the one refused, until the relay refuses it so too (seed 4003's year, day
        112.09: relay0's policy on ``#a`` ended between its refusal and the probe, which it
        served; gsync then asked ``#a`` without notes in its live REQs)."""
        try:
            verb, sub_id, *_ = json.loads(frame)
            entry = probes.pop(sub_id, None)
        except (ValueError, TypeError):
            return
        if entry is not None and verb == "EOSE" and _PRECISE_SERVED not in entry[2:]:
            entry.append(_PRECISE_SERVED)

    def _refused_ask_answered(self, conn, asked: dict, frame: str) -> None:
        """An EOSE or CLOSED of a REQ counted as an ask of a refused tag key (``asked``: the
        connection's, by sub id). Closed for a rate, for too many REQs open or for AUTH, the
        relay did not answer it: gsync sending it again once the cooldown allows is the same
        ask (as ``_id_ask_answered`` judges an id's), taken back from the count (seed 13 of
        --fault-scale 3 with --per-filter 0.3: a `#e` the relay blocked, asked alone to find
        the culprit, met a rate limit of minutes; each probe after a cooldown counted).
        Served (EOSE), the relay refuses that key no more: its refusal is over, later asks
        are not counted against it (seed 4003's year, day 112.09: a policy of an hour, ended
        before gsync asked the shape once more and restored it)."""
        try:
            verb, sub_id, *rest = json.loads(frame)
            entries = asked.pop(sub_id, ())
        except (ValueError, TypeError):
            return
        if verb == "EOSE" and entries:
            relay = self.sim.relays.get(conn.relay)
            if relay is not None and relay.precise_only:
                return  # (it answers an imprecise REQ with EOSE alone, refused or not)
            refused = self.refused_at.get(conn.relay, {})
            for key, entry in list(refused.items()):
                if any(entry is e for e in entries):
                    del refused[key]
                    self.refused_by.pop((conn.relay, key), None)
            return
        reason = rest[0] if verb == "CLOSED" and rest and isinstance(rest[0], str) else ""
        if not reason.startswith(("rate-limited:", "auth-required:", "restricted:")) and "too many" not in reason:
            return
        for entry in entries:
            if (conn.number, sub_id) in entry[2:]:
                entry.remove((conn.number, sub_id))
                entry[1] -= 1

    def _drop_refusals(self, drop) -> None:
        """Forget the refusals ``drop(relay, read_at)`` says gsync no longer holds, or whose
        probe period is over."""
        for url, refused in list(self.refused_at.items()):
            for key, (read_at, *_) in list(refused.items()):
                if drop(url, read_at):
                    del refused[key]
                    self.refused_by.pop((url, key), None)
            if not refused:
                del self.refused_at[url]

    def _relay_state(self, url: str) -> tuple:
        """Which of gsync's records of ``url`` is current: the process, and its table's
        object (a relay retired and listed again gets a new one)."""
        m = self.sim.manager
        return self.sim.gen, m.relays.get(url) if m is not None else None

    def forgotten(self, urls: set[str]) -> None:
        """gsync forgot what it saved of ``urls`` (no repository listed them when it was
        ready): their dead marks and refusals went with it; judged from their return."""
        for url in urls:
            self.tabled_since.pop(url, None)
        self._drop_refusals(lambda url, read_at: url in urls)

    def dialled(self, url: str) -> None:
        now = self.sim.clock.now
        self.account(url)
        self.failing_since[url] = now  # (until its session opens: a failure if none does)
        times = self.dials.setdefault(url, [])
        if times and now - times[-1] >= 20 * HOUR:  # a dead relay's daily attempt
            self.daily_dial[url] = now
            if not getattr(self.sim.relays.get(url), "up", False):  # failed: the next is a day later (``neglect``)
                self.long_down_ended[url] = now
        else:
            self.daily_dial.pop(url, None)
        times.append(now)
        while times and now - times[0] > DAY + HOUR:
            times.pop(0)
        downs = self.downs.get(url, [])
        while downs and now - downs[0] > HOUR:
            downs.pop(0)
        bound = 30 + 3 * len(downs)  # a relay restarting often is dialled again after each restart
        # (the dials of the last hour: those at the end of the list, in time order)
        if len(times) - bisect_left(times, True, key=lambda t: now - t <= HOUR) > bound:
            self.violation("dial_storm", f"{url}: more than {bound} handshakes within an hour "
                                         f"({len(downs)} restarts)")
        self._sighted(url, *self._relay_state(url))
        since = self.down_since.get(url)
        if since is not None:  # (a relay retired forgets its dead mark: counted from its return to the table)
            since = max(since, self.tabled_since.setdefault(url, now))
        dead_at = None if since is None else since + constants.DEAD_AFTER_SECS + self.sim.manager.config.sync.max_backoff_secs
        unsaved = self.unsaved_dials.get(url)
        if unsaved:
            unsaved[:] = [t for t in unsaved if now - t <= DAY + HOUR]
        if dead_at is not None and now > dead_at + HOUR:
            earlier = [t for t in times[:-1] if t > dead_at and t not in (unsaved or ())]
            if earlier and now - earlier[-1] < constants.DEAD_RETRY_SECS - HOUR:
                self.violation("dead_dialled", f"{url}: dialled {now - earlier[-1]:.0f}s after the last attempt, "
                                               f"down for {(now - since) / HOUR:.1f} h")

    def _sighted(self, url: str, gen: int, state) -> None:
        """A dial or a sample shows gsync's record of ``url``. A record other than the one
        last seen in this process: retired and listed again in between (seed 329's year, day
        75.37: dropped and listed again 4 s later, between two samples; seed 618's, day
        343.008: a process started with relay3's dead mark retired and listed it again).
        Unless its dead mark was kept (``_dead_mark_kept``), its dials count from its return."""
        now = self.sim.clock.now
        seen = self.sighted.get(url)
        if seen is not None and seen[1] is not state and (
                (seen[0] == gen and not self._dead_mark_kept(url, seen[2]))
                or self.retired_in.pop(url, gen) != gen):
            # (a process that retired it kept its dead mark in memory, not on disk: a process
            # started since knows nothing of it: seed 80's 60 days, day 44.79)
            self.tabled_since.pop(url, None)  # (set again at its next dial)
        self.retired_in.pop(url, None)
        self.sighted[url] = (gen, state, now)

    def _dead_mark_kept(self, url: str, seen_at: float | None = None) -> bool:
        """Was ``url``, retired by this process after ``seen_at`` (the last time its table
        held it: its last dial or sample), dead to gsync then, and is that within the day a
        retired relay's dead mark is kept (``health.retire``)? Then its dials go on being
        judged from when it went down, not from its return (seed 329's year, day 75.37:
        relay5, dead, dropped and listed again 4 s later, was dialled with backoff anew
        before gsync kept the mark)."""
        now = self.sim.clock.now
        if seen_at is None:
            seen = self.sighted.get(url)
            if seen is None or seen[0] != self.sim.gen:
                return False
            seen_at = seen[2]
        since = self.down_since.get(url)
        if since is None or now - seen_at >= constants.DEAD_RETRY_SECS - HOUR:
            return False
        since = max(since, self.tabled_since.get(url, seen_at))
        return seen_at > since + constants.DEAD_AFTER_SECS + self.sim.manager.config.sync.max_backoff_secs + HOUR

    # -- periodic -------------------------------------------------------------------------

    def schedule(self, end: float) -> None:
        sim = self.sim
        t = START + 600
        while t <= end:
            sim.at(t, self.bounded)
            t += 600
        t = START + HOUR
        while t <= end:
            sim.at(t, self.busy, int((t - START) // HOUR) - 1)
            t += HOUR
        t = START + NEGLECT_WINDOW_SECS
        while t <= end:
            sim.at(t, self.neglect)
            t += NEGLECT_WINDOW_SECS
        if sim.liveness_after is not None:
            t = START + sim.liveness_after * DAY + 25 * HOUR
            while t <= end:
                sim.at(t, self.liveness)
                t += HOUR

    def finish(self) -> None:
        pass

    def busy(self, hour: int) -> None:
        self.ids_judgements()
        m = self.sim.manager
        n = self.hour_messages.pop(hour, 0)
        types, self.hour_types = self.hour_types, {}
        if n > self.max_hour_messages:
            self.max_hour_messages = n
            top = sorted(types.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
            self.max_hour_detail = f"day {hour / 24:.2f}: " + ", ".join(f"{k} {v}" for k, v in top)
        actions = self.hour_actions.get(hour, 0) + self.hour_actions.get(hour - 1, 0)
        self.hour_actions.pop(hour - 1, None)
        relays = len(m.relays) if m is not None else 0
        bound = BUSY_BASE + BUSY_PER_RELAY * relays + BUSY_PER_ACTION * actions
        if n > bound:
            self.violation("busy_loop", f"hour {hour}: {n} messages > {bound:.0f} ({relays} relays, {actions:.0f} actions)")

    def wanted_relays(self, tabled: bool = False) -> tuple[set[str], dict[str, set[str]]]:
        """The relays gsync should sync from (bootstrap, or listed by an announcement the
        own relay holds), and per repository address the relays its announcement lists.
        ``tabled``: also those listed by the newest announcement of a repository the running
        gsync's self-subscription showed it, where the own relay holds another (a loss took
        it, or gsync has not been shown the newer one yet): gsync keeps the newest one it was
        shown until it restarts, and a process started after a loss took the newest was shown
        the older one only (seed 6's year, day 129.35). The untabled answer is computed again
        only when the own relay's announcements changed (do not modify it)."""
        own = self.sim.own
        key = (own.listing_changes, id(own.accepted))
        if self._wanted is None or self._wanted[0] != key:
            self._wanted = key, self._wanted_now()
        wanted, listing = self._wanted[1]
        if tabled:
            wanted = set(wanted)
            for address, (_, event_id) in self.shown.items():
                if own.accepted.get(address) != event_id and (event := self.sim.world.events.get(event_id)):
                    wanted |= self.announced(event)
        return wanted, listing

    _wanted = None  # (own relay's listing changes, accepted) -> (wanted, listing)

    def _wanted_now(self) -> tuple[set[str], dict[str, set[str]]]:
        own = self.sim.own
        wanted = set(self.sim.world.bootstrap)
        listing: dict[str, set[str]] = {}
        for address, event_id in own.accepted.items():
            event = own.store.events.get(event_id)
            if event is None:
                continue
            urls = self.announced(event)
            listing[address] = urls
            wanted |= urls
        return wanted, listing

    def announced(self, event) -> frozenset[str]:
        """The remote relays an announcement lists (kept per announcement: the wanted set is
        made again at each change of the own relay's store, from every announcement it holds)."""
        urls = self._announced.get(event.id)
        if urls is None:
            urls = self._announced[event.id] = frozenset(
                {v.rstrip("/") for v in all_values(event, "relays")} - {f"wss://{DOMAIN}", f"ws://{DOMAIN}"})
        return urls

    _announced: dict  # announcement id -> announced(it) (bounded by the world's announcements)

    def owed_relays(self) -> set[str]:
        """The relays gsync owes a session (``neglected_relay``): ``wanted_relays``, but
        where a loss took the newest announcement of a repository the own relay stored, only
        the relays both that newest one and the older one the own relay holds now list.
        gsync keeps the newest its self-subscription showed (SPEC §3: it replaces the relay
        set) until it restarts, and the older one after: a relay only the older one lists is
        retired, as it should be (seed 1, 20 relays x 200 repos, 30 days: relay10 judged
        neglected from day 28.5), and one only the newest lists is not dialled after a
        restart (seed 2's year, when the newest replaced the older: 74 neglected_relay)."""
        wanted, listing = self.wanted_relays()
        own = self.sim.own
        key = (own.listing_changes, id(own.accepted))
        if self._owed is None or self._owed[0] != key:
            owed = wanted
            lost = [(address, event_id) for address, (_, event_id) in own.newest.items()
                    if own.accepted.get(address, event_id) != event_id]
            if lost:
                listed = dict(listing)
                for address, event_id in lost:
                    if address in listed and (newest := self.sim.world.events.get(event_id)) is not None:
                        listed[address] = listed[address] & self.announced(newest)
                owed = set(self.sim.world.bootstrap).union(*listed.values())
            self._owed = key, owed
        return self._owed[1]

    _owed = None  # (own relay's listing changes, accepted) -> owed_relays()

    def bounded(self) -> None:
        m = self.sim.manager
        now = self.sim.clock.now
        owed = self.owed_relays()
        # (each REQ is checked against those left)
        self._drop_refusals(lambda url, read_at: now - read_at >= constants.POLICY_PROBE_SECS)
        for url in self.uptime:
            if url not in owed:  # (neglect judges only the time a relay was owed: sampled here)
                self.account(url)
                self.uptime[url] = [now, 0.0, 0.0]
        wanted, _ = self.wanted_relays()
        if m is None:
            return
        self.unexplained_pauses()
        if now - self.scraped_at >= SCRAPE_SECS:  # a scrape of /metrics: the gauges it sets, checked below
            self.scraped_at = now
            m.update_metrics(now)
        table = list(m.relays.keys())
        if any(url not in wanted for url in table):
            wanted, _ = self.wanted_relays(tabled=True)
        for url in table:
            if (url in wanted or now - self.own_lost_at < 26 * HOUR
                    or now < m.relays[url].lost_until and now - self.first_read_at < constants.LOST_LOOK_SECS):
                # (gsync is not told what the own relay lost: it learns it within a day; a
                # process started after a loss asks the relays that confirmed what it lost,
                # for a day at most from its first read of the own relay, which an own relay
                # away at the start delays: ``lifecycle.look_for_lost``; seed 130 of the
                # stress mix, read 1.5 h after the start)
                self.unwanted_since.pop(url, None)
            elif now - self.unwanted_since.setdefault(url, now) > HOUR:
                self.violation("relay_table", f"{url} unwanted for {(now - self.unwanted_since[url]) / HOUR:.1f} h")
        for url in list(self.unwanted_since):
            if url not in m.relays:
                del self.unwanted_since[url]
        gen = self.sim.gen
        for url, state in m.relays.items():
            self._sighted(url, gen, state)
        for url in list(self.tabled_since):
            if url in m.relays:
                continue
            if url in m.health._retired and self._dead_mark_kept(url):
                self.retired_in[url] = gen  # (its dead mark kept by this process only)
            else:  # retired (its dead mark not kept), or forgotten by a new process
                del self.tabled_since[url]
                self.sighted.pop(url, None)
                self.retired_in.pop(url, None)
        # A relay gsync keeps nothing of (retired, or forgotten at a start that did not list
        # it): its refusals went with it, as its dead mark does (seed 94, day 1.0065: the own
        # relay lost everything; the next process forgot relay2's saved pauses, and asked #a
        # again when relay2 was listed again)
        self._drop_refusals(lambda url, read_at: url not in m.relays and url not in m.saved._memories)
        known = {*table, "own"}
        if self.labelled is None:
            self.labelled = [(m, itemgetter(m._labelnames.index("relay"))) for m in metrics.relay_labelled()]
        for metric, relay_of in self.labelled:
            if known.issuperset(map(relay_of, metric._metrics)):
                continue  # (the usual case, without a loop in Python: the scan of every series showed in profiles)
            for relay in map(relay_of, metric._metrics):
                if relay not in known:
                    self.violation("metric_labels", f"{metric._name}{{relay={relay}}} for a relay not in the table")
                    break
        self.polled_beside_room(m, now)
        missed = _missed_live()
        for url, value in missed.items():
            if value > self.missed_live.get(url, 0.0) and self.keeps_live(url):
                self.violation("live_missed_falsely", f"{url}: {value - self.missed_live.get(url, 0.0):.0f} events "
                                                      "judged missed by live subscriptions it keeps")
        self.missed_live = missed
        for url, state in m.relays.items():
            learnt, relay = state.max_subscriptions_learned, self.sim.relays.get(url)
            if (learnt is not None and relay is not None and learnt < relay.max_subs
                    and self.cap_reported.get(url) != learnt):
                self.cap_reported[url] = learnt
                self.violation("subscription_cap_low", f"{url}: {learnt} learnt, the relay holds {relay.max_subs}")
            cap = state.current.page_cap
            if (cap is not None and cap.until_ignored and relay is not None and not relay.ignores_until
                    and (url, state.session) not in self.until_reported):
                self.until_reported.add((url, state.session))
                self.violation("until_misjudged", f"{url}: taken for a relay ignoring until; it reads it as NIP-01 says")
            if state.precise_queries and relay is not None and not relay.precise_only and url not in self.precise_reported:
                self.precise_reported.add(url)
                self.violation("precise_misjudged", f"{url}: marked as answering only precise queries; it answers all")
        world_events = len(self.sim.world.events) + self.sim.faults.injected
        bounds = [("seen", len(m.seen), world_events), ("rejected", len(m.rejected), m.rejected.max_entries),
                  ("own_held", len(m.own_held), constants.OWN_HELD_MAX_EVENTS + world_events),
                  ("recovery_ids", len(m.recovery._owners), world_events),
                  ("health", len(m.health._relays), len(self.sim.relays)),
                  ("health_retired", len(m.health._retired), len(self.sim.relays)),
                  ("retired_pauses", len(m.lifecycle.retired_pauses), len(self.sim.relays)),
                  ("claims", len(m.claims), world_events), ("lead", len(m.lead), world_events)]
        for name, size, bound in bounds:
            if size > bound:
                self.violation("table_bound", f"{name}: {size} > {bound}")

    def unexplained_pauses(self) -> None:
        """Every shape gsync holds paused on a relay (a policy refusal) has a tag that relay
        refused ``blocked:`` (the only policy of the simulated relays): a pause for anything
        else, a refusal for want of an AUTH the relay takes, a rate limit, is a bug."""
        for url, state in self.sim.manager.relays.items():
            refused = self.ever_refused.get(url, ())
            # (a relay refusing filters that may bring notes: its shapes paused until the
            # probe without notes out now answers, ``Refusals.probe_kinds``; seed 5116 of the
            # per-filter stress mix with --anti-sync-bots sampled that second)
            # (or the shape asked as it was once that probe was served: ``check_imprecise``)
            probing = any(isinstance(p, (KindsProbe, ImpreciseCheck)) for p in state.current.probes.values())
            for key in state.paused.keys():
                if probing and key in state.current.kinds_suspects:
                    continue
                if not any(name in refused for name in key[1]):
                    self.violation("unexplained_pause", f"{url} {describe(key)} paused, never refused by policy")
            relay = self.sim.relays.get(url)
            if state.precise_refused and relay is not None and not relay.anti_sync_bots:
                self.violation("notes_misjudged", f"{url} asked without notes, refusing none")

    def polled_beside_room(self, m, now: float) -> None:
        """``polled_with_room``, at a sample."""
        for url, state in m.relays.items():
            polled = ((state.fresh_polled.filters or state.polled.filters) and state.connected
                      and state.paused.allowed(state.fresh_polled.filters + state.polled.filters))
            if (not polled or state.current.capacity_refused or state.current.syncing()
                    or self.sim.relays[url].closes_after_eose or not live_groups_with_room(state, polled)):
                self.polled_room_since.pop(url, None)
            elif now - self.polled_room_since.setdefault(url, now) > constants.POLLED_CONSOLIDATION_CHECK_SECS + 1200:
                self.violation("polled_with_room", f"{url}: {len(polled)} filters polled beside a free live slot "
                                                   f"for {(now - self.polled_room_since[url]) / 60:.0f} min")
                self.polled_room_since[url] = now  # (once a stretch)
        for url in [u for u in self.polled_room_since if u not in m.relays]:
            del self.polled_room_since[url]

    def liveness(self) -> None:
        sim = self.sim
        now = sim.clock.now
        self.liveness_checks += 1
        wanted, listing = self.wanted_relays()
        listing = self._followed(listing)
        missing = []
        for url in sorted(wanted):
            relay = sim.relays.get(url)
            if relay is None or not relay.up:
                continue
            if now - self.long_down_ended.get(url, float("-inf")) < 26 * HOUR:
                # dead to gsync (back from 20 h down, or its daily attempt failed): its
                # next attempt comes a day later, as SPEC asks (``neglect`` gives it the same
                # leave; test_sim's dead relay whose daily attempt failed, in a world with
                # imports: a comment published to it alone an hour after)
                continue
            # (a relay dropping live subscriptions: what only it gets comes by the next live
            # audit, LIVE_AUDIT_SECS after the last at most, and minutes to fetch and deliver)
            grace = HOUR if not relay.drops_live else constants.LIVE_AUDIT_SECS + HOUR / 2
            for event in relay.store.events.values():
                if (event.id in relay.hidden or now - self.published_at.get(event.id, START) < grace
                        or event.created_at > now - HOUR):  # (dated ahead: owed an hour after its time)
                    continue
                if not self.own_has(event) and self.owed(event, url, listing):
                    missing.append((url, event))
        self.left_behind_max = max(self.left_behind_max, len(missing))
        if missing:
            url, event = missing[0]
            self.violation("left_behind", f"{len(missing)} events, e.g. kind {event.kind} {event.id[:16]} on {url} "
                                          f"(published day {(self.published_at.get(event.id, START) - START) / DAY:.2f})")

    def _followed(self, listing: dict[str, set[str]]) -> dict[str, set[str]]:
        """``listing`` as the running gsync follows it: where its self-subscription showed it
        a newer announcement of a repository than the one the own relay holds (a loss took
        the newer one), that newer one's relays. gsync keeps the newest it was shown (SPEC
        §3) until it restarts: the events of a relay only the older one lists are not owed
        (seed 52's 30 days of 3 x 8: a loss took repo7's newest announcement, listing relay0;
        the own relay took back the older one, listing relay2; 4 roots on relay2 judged left
        behind)."""
        own, events = self.sim.own, self.sim.world.events
        followed = listing
        for address, (at, event_id) in self.shown.items():
            held = events.get(own.accepted.get(address, ""))
            if held is None or held.id == event_id or (at, held.id) < (held.created_at, event_id):
                continue  # the own relay holds it, or a newer one gsync will be shown
            if (shown := events.get(event_id)) is not None:
                if followed is listing:
                    followed = dict(listing)
                followed[address] = self.announced(shown)
        return followed

    def refilled(self, lost: list[str], back_at: float) -> None:
        """``own_loss_refilled``: ``REFILL_SECS`` after the own relay came back without
        ``lost`` (events it had stored), while gsync ran, each is on it again where a relay
        gsync syncs holds it and owes it (as ``liveness`` judges, at that moment). Not judged
        when anything else happened to the own relay since (away again, full, read-only,
        limiting writes) or gsync started or stopped: those have their own rules. Before the
        own relay's witnesses (``sync.own_witness``) such a loss waited for each relay's daily
        sync."""
        sim, own = self.sim, self.sim.own
        if (sim.manager is None or self.started_at >= back_at or self.own_away_at >= back_at
                or max(own.full_until, own.readonly_until, own.write_limit_until) >= back_at):
            return
        now = sim.clock.now
        wanted, listing = self.wanted_relays()
        listing = self._followed(listing)
        missing = []
        for event_id in lost:
            if event_id in own.store:
                continue
            for url in sorted(wanted):
                relay = sim.relays.get(url)
                event = relay.store.events.get(event_id) if relay is not None and relay.up else None
                if (event is None or event_id in relay.hidden or self._unsettled(url, back_at)
                        or now - self.long_down_ended.get(url, float("-inf")) < 26 * HOUR):
                    continue
                if not self.own_has(event) and self.owed(event, url, listing):  # (or a newer one of its key)
                    missing.append((url, event))
                    break
        if missing:
            url, event = missing[0]
            self.violation("own_loss_refilled", f"{len(missing)} of {len(lost)} events the own relay lost, "
                           f"back {(now - back_at) / HOUR:.1f} h ago, not on it again, e.g. kind {event.kind} "
                           f"{event.id[:16]} on {url}")

    def _unsettled(self, url: str, since: float) -> bool:
        """Was ``url`` down since ``since`` (or in the 30 h before, the longest outage),
        refusing a filter by policy (gsync pauses it, and probes it again in its own time), or
        does it ignore ``until`` where gsync has no NIP-77 there now? Then what it holds may
        wait for gsync's backoff, probe or rest (``own_loss_refilled``)."""
        relay = self.sim.relays[url]
        if relay.ignores_until:
            # past a first page only NIP-77 and ids reach what it holds, and where gsync rests
            # from either there (a day after it failed) it waits for the rest's end (seed 32
            # of the caps world with --per-filter 1: relay1 advertised 688 ids, served 3), or
            # for the next session where a query-rate refusal turned NIP-77 off for this one
            # (SPEC §5; seed 923 of the 20-relay world in bench/README's third session of
            # 2026-12-07: relay6 limits queries)
            state = self.sim.manager.relays.get(url)
            now = self.sim.clock.now
            if (state is None or state.nip77_resting(now) or not state.current.negentropy_ok
                    or not self.sim.manager.health.negentropy_allowed(url) or not state.serves_ids(now)):
                return True
        # (``downs`` keeps the last hour only, for the dial checks: an outage is known by its
        # span too, kept 26 h, and a relay down now by when it went: seed 114 of a fault-scale-3
        # world judged a relay back seconds before, down the six hours since the own relay's
        # loss, gsync's hourly redial not come yet)
        return bool(relay.refused_tags or url in self.down_since
                    or any(t >= since - 30 * HOUR for t in self.downs.get(url, ()))
                    or any(end >= since - 30 * HOUR for _, end in self.down_spans.get(url, ()))
                    or any(entry[0] >= since - 4 * DAY for entry in self.refused_at.get(url, {}).values()))

    def owed(self, event, url: str, listing) -> bool:
        """Would gsync owe this event to the own relay, found on ``url``?"""
        own = self.sim.own
        relay = self.sim.relays[url]
        if relay.ignores_until and not (relay.nip77 and relay.neg_mode == "serve" and relay.max_sync_events is None
                                        and relay.neg_silent_cap is None):
            # past its first page, no query reaches a filter's older events on a relay that
            # ignores until and has no NIP-77 to list them (or caps its results, with an error
            # or silently: windows by until do not shrink there), layer 1's announcements too
            # (seed 436 of the stress mix): gsync logs ``unpaged_incomplete``
            return False
        if relay.precise_only and (not self._probe_finds(url) or (
                event.kind == 30617 and not self._owner_known(event.pubkey, url))):
            # a relay answering only precise queries is found so by a probe for what gsync
            # knows it should hold (``protocol.precise``): one holding none of it gives
            # nothing; once found, it is asked announcements by the owners of the
            # repositories listing it: someone else's is found elsewhere, or not at all
            return False
        if relay.anti_sync_bots and event.kind == 1:
            # a relay refusing filters that may bring notes without naming authors (AntiSyncBots)
            # is asked NIP-34's kinds but notes (``protocol.precise``): a note comes from others
            return False
        if event.kind == 30617:
            # gsync keeps the newest announcement its self-subscription showed it (SPEC §3,
            # ``_followed``): an older one is superseded to it, though a loss took the newer
            # one from the own relay (seed 118's 45 days at abandon rate 1, day 44.04: the own
            # relay, emptied, held an older announcement again, listing relay2; gsync followed
            # the newest it was shown, not listing relay2, where one between the two was)
            at, shown_id = self.shown.get(event.address, (-1, ""))
            return (event.created_at, shown_id) >= (at, event.id) and own.lists_us(event)
        repo = self.sim.world.repo_of.get(event.id)
        if repo is None or repo.address not in listing or url not in listing[repo.address]:
            return False
        roots = [t[1] for t in event.tags if len(t) >= 2 and t[0] == "E"]
        member = self.sim.world.member_of.get(event.id)
        if member is not None:  # a reply to a member: found by the member, once it and its root are held
            roots += [member, *(t[1] for t in self.sim.world.events[member].tags if len(t) >= 2 and t[0] == "E")]
        if any(root not in own.store for root in roots):
            return False  # gsync finds a comment by its root: one it cannot know of is not owed
        now = self.sim.clock.now
        if any(now - own.stored_at.get(root, START) < HOUR for root in roots):
            # ... from when that root reached the own relay, with the hour a publication
            # has (seed 418's year, day 364.9583: a root came with a new announcement and
            # its comment 9 s later; the hourly check fell between the two)
            return False
        accepted = own.accepted.get(repo.address)
        if accepted is not None and now - own.stored_at.get(accepted, START) < HOUR:
            # ... and from when its repository came back to the own relay (seed 12 of a caps
            # world, day 9.25: the own relay, emptied, took an older announcement again 100 s
            # before the check, and the patch it had refused meanwhile was fetched again and
            # stored 110 s after)
            return False
        return own.accepts(event)[0]

    def _probe_finds(self, url: str) -> bool:
        """Does ``url`` hold what gsync's probe for a relay answering only precise queries
        asks (``lifecycle.on_probe_wanted``): an announcement or state by an owner of a
        repository the running gsync knows lists it, or one of those repositories' roots?"""
        m = self.sim.manager
        if m is None:
            return False
        now = self.sim.clock.now
        found = self._probe_found.get(url)
        if found is not None and found[0] == now:  # (once a check, not once an event owed)
            return found[1]
        listing = m.repos.repos_listing(url)
        owners = set(map(owner_of, listing))
        roots = {root for a in listing for root in m.repos.get(a).root_events}
        store = self.sim.relays[url].store.events
        finds = any(event_id in store for event_id in roots) or any(
            e.kind in (30617, 30618) and e.pubkey in owners for e in store.values())
        self._probe_found[url] = (now, finds)
        return finds

    def _owner_known(self, pubkey: str, url: str) -> bool:
        """Does ``pubkey`` own a repository the running gsync knows lists ``url``?"""
        m = self.sim.manager
        return m is not None and any(owner_of(a) == pubkey for a in m.repos.repos_listing(url))

    def own_has(self, event) -> bool:
        store = self.sim.own.store
        if event.id in store:
            return True
        key = store.key(event)
        held = store.events.get(store.by_key.get(key)) if key is not None else None
        return held is not None and held.created_at >= event.created_at


def _missed_live() -> dict[str, float]:
    """gsync_live_events_missed_total by relay."""
    return {sample.labels.get("relay"): sample.value for family in metrics.LIVE_EVENTS_MISSED.collect()
            for sample in family.samples if sample.name.endswith("_total")}
