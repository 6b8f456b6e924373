"""Faults drawn from the seed, each a Poisson process with a rate (per relay per day unless
said), stopped on the liveness day (``Simulation.liveness_after``), when everything heals."""
from __future__ import annotations

import json
import random

from ..protocol.event import compute_id
from .relay import filter_from_json
from .world import DAY, START

HOUR = 3600.0

# (name, rate per relay per day); "world" faults are per day for the whole world
RELAY_RATES = {
    "disconnect": 1.0,  # the relay drops every connection, stays up
    "restart": 0.4,  # down 5 s - 10 min; one in five loses 5 % of its events
    "outage": 0.04,  # down 1-30 h
    "flapping": 0.05,  # restarts every few minutes for 2-12 h
    "dead_for_good": 0.004,
    "rate_limit": 0.5,  # REQ and NEG-OPEN refused "rate-limited:" for 30 s - 10 min
    "policy": 0.08,  # a tag key refused "blocked:" for 1 h - 3 days
    "no_eose": 0.15,  # historic REQs get no EOSE for 10 min - 2 h
    "nip77_notice": 0.1,  # NEG-OPEN refused by NOTICE for 1 h - 1 day
    "nip77_silent": 0.1,  # NEG-OPEN never answered for 1 h - 1 day
    "ids_unserved": 0.08,  # ids advertised by NIP-77, REQ {ids} serves nothing, 1 h - 1 day
    "hidden": 0.05,  # a few events stored and advertised, never served (for good)
    "junk": 0.2,  # for 10 min, answers carry a forged and an unrequested event
}
# A relay dropped by every repository listing it (each re-announced without it; one it was
# the only relay of moves to another): gsync must retire it. Per day for the world, drawn
# from a generator of its own, so that the other faults of a seed stay where they were.
ABANDON_PER_DAY = 0.25
# The own relay's disk full for 10 min - 6 h: every write refused "error: no space left on
# device" (what it holds is still served, and duplicates still answered). Per day, drawn
# from a generator of its own as abandonment is.
OWN_FULL_PER_DAY = 0.1
# The own relay put read-only for 10 min - 6 h (maintenance, a write policy switched on):
# every event refused "restricted:", a final refusal. Per day, a generator of its own.
OWN_READONLY_PER_DAY = 0.1
# The own relay limiting gsync's writes for 10 min - 6 h as ngit-relay (khatru) limits an
# address (PEERS.md): a burst of 15, then one every 4 s; the rest refused "rate-limited:".
# Per day, a generator of its own.
OWN_RATE_LIMITED_PER_DAY = 0.1
# Those three windows of the own relay's: (SimOptions rate, the name its generator is drawn
# as, the OwnRelay attribute holding when the window ends). Each its own generator, so that
# one at 0 leaves the others, and the world, where they were.
OWN_WINDOWS = (
    ("own_full", "own-full", "full_until"),
    ("own_rate_limited", "own-rate-limited", "write_limit_until"),
    ("own_readonly", "own-readonly", "readonly_until"),
)
WORLD_RATES = {
    "own_away": 0.3,  # the own relay away 30 s - 2 h; 35 % lose their last writes, 5 % all
    "gsync_killed": 0.3,  # killed, started again after 1 s - 2 min on its state_dir
    "gsync_stopped": 0.15,  # stopped (SIGTERM), started again
}


class Faults:
    def __init__(self, sim, rng):
        self.sim = sim
        self.rng = rng
        self.counts: dict[str, int] = {}
        self.junk_until: dict[str, float] = {}
        self.injected = 0

    def schedule(self, end: float) -> None:
        sim = self.sim
        if not sim.options.faults:
            return
        stop = end if sim.liveness_after is None else START + sim.liveness_after * DAY
        scale = sim.options.fault_scale
        for name in sorted(RELAY_RATES):
            for url in sim.world.relay_urls:
                self._arrivals(name, RELAY_RATES[name] * scale, stop, url)
        for name in sorted(WORLD_RATES):
            self._arrivals(name, WORLD_RATES[name] * scale, stop, None)
        self.abandon_rng = random.Random(f"abandon:{sim.options.seed}")
        t = sim.clock.now
        rate = sim.options.abandon_per_day * scale
        while rate > 0 and (t := t + self.abandon_rng.expovariate(rate / DAY)) < stop:
            sim.at(t, self.abandon)
        for option, drawn_as, until_attr in OWN_WINDOWS:
            rng = random.Random(f"{drawn_as}:{sim.options.seed}")
            t = sim.clock.now
            rate = getattr(sim.options, option) * scale
            while rate > 0 and (t := t + rng.expovariate(rate / DAY)) < stop:
                sim.at(t, self.own_window, option, until_attr, min(stop, t + rng.uniform(600, 6 * HOUR)))
        if sim.liveness_after is not None:
            sim.at(stop, self.heal)

    def _arrivals(self, name: str, per_day: float, stop: float, url) -> None:
        if per_day <= 0:
            return
        t = self.sim.clock.now
        while True:
            t += self.rng.expovariate(per_day / DAY)
            if t >= stop:
                return
            self.sim.at(t, self.fire, name, url)

    def fire(self, name: str, url) -> None:
        sim, r = self.sim, self.rng
        self.counts[name] = self.counts.get(name, 0) + 1
        relay = sim.relays.get(url) if url else None
        if relay is not None and relay.dead:
            return
        now = sim.clock.now
        if name == "disconnect":
            sim.note("fault", name, url)
            sim.drop_sessions(url)
        elif name == "restart":
            sim.relay_down(url, r.uniform(5, 600), lose=0.05 if r.random() < 0.2 else 0.0)
        elif name == "outage":
            sim.relay_down(url, r.uniform(HOUR, 30 * HOUR))
        elif name == "flapping":
            t, until = now, now + r.uniform(2 * HOUR, 12 * HOUR)
            while t < until:
                sim.at(t, sim.relay_down, url, r.uniform(5, 30))
                t += r.uniform(120, 400)
        elif name == "dead_for_good":
            sim.relay_down(url, None)
        elif name == "rate_limit":
            relay.rate_limited_until = max(relay.rate_limited_until, now + r.uniform(30, 600))
        elif name == "policy":
            key = r.choice(("q", "E", "e", "a"))
            relay.refused_tags = relay.refused_tags | {key}
            sim.at(now + r.uniform(HOUR, 3 * DAY), self.unrefuse, url, key)
        elif name == "no_eose":
            relay.no_eose = True
            sim.at(now + r.uniform(600, 2 * HOUR), setattr, relay, "no_eose", False)
        elif name in ("nip77_notice", "nip77_silent"):
            relay.neg_mode = "notice" if name == "nip77_notice" else "ignore"
            sim.at(now + r.uniform(HOUR, DAY), setattr, relay, "neg_mode", "serve")
        elif name == "ids_unserved":
            relay.ids_unserved = True
            until = now + r.uniform(HOUR, DAY)
            relay.ids_unserved_spans.append((now, until))
            sim.at(until, setattr, relay, "ids_unserved", False)
        elif name == "hidden":
            ids = sorted(relay.store.events)
            for event_id in r.sample(ids, min(len(ids), 3)):
                relay.hidden.add(event_id)
        elif name == "junk":
            self.junk_until[url] = now + 600
        elif name == "own_away":
            if sim.own.up:
                x = r.random()
                lose = float("inf") if x < 0.05 else r.uniform(1, 600) if x < 0.4 else 0.0
                sim.own_away(r.uniform(30, 2 * HOUR), lose)
        elif name in ("gsync_killed", "gsync_stopped"):
            if sim.manager is not None:
                sim.stop_gsync(graceful=name == "gsync_stopped")
                sim.at(now + r.uniform(1, 120), sim.start_gsync)
        if relay is not None or name in WORLD_RATES:
            sim.note("fault", name, url or "")

    def own_window(self, name: str, until_attr: str, until: float) -> None:
        """One of the own relay's OWN_WINDOWS opens (or lasts longer) until ``until``."""
        self.counts[name] = self.counts.get(name, 0) + 1
        own = self.sim.own
        setattr(own, until_attr, max(getattr(own, until_attr), until))
        self.sim.note("fault", name, f"{until:.0f}")

    def abandon(self) -> None:
        """A remote relay (not a bootstrap one) every repository listing it drops: each is
        announced again without it, published as a user would (to its relays, one time in
        five to the own relay too)."""
        sim, r, world = self.sim, self.abandon_rng, self.sim.world
        listed = [u for u in world.relay_urls + world.spare_urls
                  if u not in world.bootstrap and any(u in repo.relays for repo in world.repos)]
        if not listed:
            return
        url = r.choice(listed)
        self.counts["abandoned"] = self.counts.get("abandoned", 0) + 1
        sim.note("fault", "abandoned", url)
        for repo in world.repos:
            if url in repo.relays:
                repo.relays = [u for u in repo.relays if u != url] or [r.choice([u for u in world.relay_urls if u != url])]
                event = world.announce(repo, int(sim.clock.now))
                sim.publish(event, list(repo.relays), own=r.random() < 0.2)

    def unrefuse(self, url: str, key: str) -> None:
        relay = self.sim.relays[url]
        relay.refused_tags = relay.refused_tags - {key}

    def heal(self) -> None:
        """The liveness day: every fault ends (a relay dead for good stays dead)."""
        sim = self.sim
        sim.note("heal")
        for url in sim.world.relay_urls + sim.world.spare_urls:
            relay = sim.relays[url]
            relay.rate_limited_until = float("-inf")
            relay.refused_tags = frozenset()
            relay.no_eose = relay.ids_unserved = False
            relay.neg_mode = "serve"
            if not relay.up and not relay.dead:
                sim.relay_up(url, force=True)
        self.junk_until.clear()
        if not sim.own.up:
            sim.own_back()
        if sim.manager is None:
            sim.start_gsync()

    def tamper(self, relay, conn, text: str, frames: list[str]) -> list[str]:
        """While ``junk`` lasts, a REQ's answer carries a forged event (a stored one with its
        content changed and its id made again: its signature does not match) and an
        unrequested one (stored, matching none of the REQ's filters), before its EOSE."""
        until = self.junk_until.get(relay.url)
        if until is None or self.sim.clock.now >= until or not text.startswith('["REQ"'):
            return frames
        events = [f for f in frames if f.startswith('["EVENT"')]
        if not events:
            return frames
        sub_id = json.loads(text)[1]
        raw = json.loads(events[0])[2]
        # its content changed and its id computed again: only the signature gives it away
        content = raw["content"] + " (forged)"
        forged = dict(raw, content=content,
                      id=compute_id(raw["pubkey"], raw["created_at"], raw["kind"], raw["tags"], content))
        extra = [json.dumps(["EVENT", sub_id, forged])]
        filters = [filter_from_json(f) for f in json.loads(text)[2:]]
        for event in relay.store.events.values():
            if not any(f.matches(event) for f in filters):
                self.sim.checker.unrequested.add((relay.url, conn.gen, conn.session, sub_id, event.id))
                extra.append('["EVENT",' + json.dumps(sub_id) + "," + event.to_json() + "]")
                break
        self.injected += len(extra)
        return events[:1] + extra + frames[1:] if frames[0] is events[0] else extra + frames
