"""Policy refusals (SPEC §5): coverage a relay will not serve is paused for 24 h, then probed
once.

Pure: the ledger takes ``now``; the manager asks it before it sends any filter (live,
historic, poll, NIP-77), so no path of derivation — consolidation, quick reconnect, the
daily fresh start, a new batch, descendants — asks a relay again for what it refused.

**What "that coverage" is.** A relay refuses a filter for what it asks, not for which values
it carries: a tag it does not index (``#q``, uppercase ``#E``), a kind it does not keep, id
lookups it does not allow. So the pause is keyed by the filter's *shape* (``coverage_key``):
its kinds, the names of its tags, whether it names ids or authors — never its values, its
window (``since``/``until``) or ``limit``. The same key then covers the historic and the
live form of a filter, every chunk of values and every chunk built later, across
reconnects and fresh starts: a relay that refuses ``#q`` is asked for ``#q`` once a day, not
once per new root. The price: a relay refusing only some values of a shape (one banned
repository) pauses the whole shape on it for a day.

**Finding the filter at fault.** A relay refuses a whole REQ when one of its filters breaks
its policy, and a policy judges shapes: ``by_shape`` splits the refused REQ into one REQ per
shape (each through the usual pacing), so the refused shape is asked once more, alone, and
then paused; the others complete. (Halving, as before, asked it again at every level: a
live REQ of eight filters holding ``#q`` asked ``#q`` six more times in one second, which
relays read as abuse.) A REQ of one shape refused is that shape's refusal at once. A shape
refused once goes alone in later REQs (``separate``), even after its probe restored it, so
that a new refusal takes nothing else down. ``halves`` remains for what is not about shape
(a REQ that stalled, or "too many filters").
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..constants import POLICY_PROBE_SECS, REQ_STALL_SECS
from ..protocol.filters import Filter
from ..protocol.messages import (
    is_filter_shape_refusal,
    says_too_many_filters,
    says_too_many_values,
    values_allowed,
)

CoverageKey = tuple  # (kinds, tag names, has ids, has authors)


def coverage_key(f: Filter) -> CoverageKey:
    """The shape a relay's policy judges: what the filter asks, not its values or window."""
    kinds = tuple(sorted(f.kinds)) if f.kinds is not None else None
    return (kinds, tuple(name for name, _ in f.tags), f.ids is not None, f.authors is not None)


def describe(key: CoverageKey) -> str:
    """A key for logs: ``{"kinds":[30618],"#d":…}`` → ``kinds=30618 #d``."""
    kinds, tags, ids, authors = key
    parts = [f"kinds={','.join(map(str, kinds))}"] if kinds is not None else []
    parts += [f"#{name}" for name in tags]
    parts += ["ids"] if ids else []
    parts += ["authors"] if authors else []
    return " ".join(parts) or "all"


def halves(items: Sequence) -> tuple[list, list]:
    """A refused group split in two (the first half the larger), to find its culprit."""
    middle = (len(items) + 1) // 2
    return list(items[:middle]), list(items[middle:])


def values_cap_after(filters: Sequence[Filter], reason: str, current: int | None) -> int | None:
    """The values a list of a filter may hold (``filter_plan.values_cap``) after a REQ of
    ``filters`` was refused for ``reason``: words naming the values in a filter ("too many
    values in filter", ``says_too_many_values``), or, for a lone filter, any words about
    its size ("filter too large"). The count the words name below its longest list
    (``values_allowed``: "max 20"), else half that list; ``current`` where the list was
    longer than the cap already known and the words name no lower one (built past it:
    sliced to it, nothing learnt). None where slicing cannot help (no list of two values)
    or which filter is at fault is not known (several, the words not naming values: split
    by filter first)."""
    if says_too_many_filters(reason) or not is_filter_shape_refusal(reason):
        return None
    if len(filters) > 1 and not says_too_many_values(reason):
        return None
    longest = max((f.most_values() for f in filters), default=0)
    if longest < 2:
        return None
    said = values_allowed(reason, longest)
    if current is not None and longest > current:
        return min(current, said or current)
    return said or longest // 2


def by_shape(filters: Sequence[Filter]) -> list[list[int]]:
    """Indices of ``filters`` grouped by ``coverage_key``, groups in order of first use."""
    groups: dict[CoverageKey, list[int]] = {}
    for i, f in enumerate(filters):
        groups.setdefault(coverage_key(f), []).append(i)
    return list(groups.values())


@dataclass
class CoveragePauses:
    """One relay's paused coverage. It outlives connections (a reconnect asks nothing
    again) and ends only through its probe: after ``POLICY_PROBE_SECS`` ``due_probes``
    hands a key out once; until the probe's answer (``probe_passed`` or a new ``pause``)
    the key still counts as paused, so nothing else recreates it meanwhile."""

    _until: dict[CoverageKey, float] = field(default_factory=dict)
    _probing: set[CoverageKey] = field(default_factory=set)
    # shapes the relay refused for themselves at least once (not an auth-required that
    # paused a whole REQ): sent alone from then on, even once restored
    _refused: set[CoverageKey] = field(default_factory=set)
    # shapes of a REQ refused by policy whose verdict is not in yet (``suspect``): alone
    # too, until served alone (``served``) or refused alone (``pause``)
    _suspects: set[CoverageKey] = field(default_factory=set)
    # paused shapes the relay refused asked without notes too (``kinds_refused``): about the
    # shape, not the notes it may bring; not asked so again while paused (saved with it)
    _kinds_refused: set[CoverageKey] = field(default_factory=set)

    def pause(self, key: CoverageKey, now: float, *, shape_at_fault: bool = True,
              probe_in: float = POLICY_PROBE_SECS) -> bool:
        """The relay refused ``key`` by policy (or left its probe unanswered: ``probe_in``
        sooner). True if that is news (a refusal of a REQ sent before the first one came back
        does not move the probe)."""
        self._probing.discard(key)
        self._suspects.discard(key)
        if shape_at_fault:
            self._refused.add(key)
        if key in self._until:
            return False
        self._until[key] = now + probe_in
        return True

    def is_paused(self, key: CoverageKey) -> bool:
        return key in self._until or key in self._probing

    def refuses_tag(self, name: str) -> bool:
        """Has the relay refused (or is it paused for) a shape asking tag ``name``?"""
        return any(name in key[1] for keys in (self._until, self._probing, self._refused) for key in keys)

    def kinds_refused(self, key: CoverageKey) -> None:
        """Paused ``key``, asked without the notes it may bring, was refused too: its pause is
        about the shape (``Refusals.probe_kinds``); known until the pause ends."""
        if self.is_paused(key):
            self._kinds_refused.add(key)

    def is_kinds_refused(self, key: CoverageKey) -> bool:
        return key in self._kinds_refused

    def is_probing(self, key: CoverageKey) -> bool:
        return key in self._probing

    def is_filter_paused(self, f: Filter) -> bool:
        return self.is_paused(coverage_key(f))

    def allowed(self, filters: Iterable[Filter]) -> list[Filter]:
        """``filters`` without the paused ones."""
        if not self:
            return list(filters)
        return [f for f in filters if not self.is_paused(coverage_key(f))]

    @property
    def refused_any(self) -> bool:
        """Does any shape go alone (``goes_alone``: refused once, or under suspicion)?"""
        return bool(self._refused or self._suspects)

    def suspect(self, filters: Iterable[Filter]) -> None:
        """A REQ of these shapes was refused by policy: one of them is at fault, and the
        REQs of one shape it was split into will tell which. Until a shape's verdict each
        goes alone in whatever REQ is built meanwhile (a consolidation, a reconnect's live
        coverage): packed again with the others, the refused one was refused again, split
        again and asked alone again, three asks within the hour."""
        self._suspects.update(coverage_key(f) for f in filters)

    def served(self, filters: Iterable[Filter]) -> None:
        """A REQ of ``filters`` was served (EOSE): a suspect shape served alone is cleared."""
        if not self._suspects:
            return
        keys = {coverage_key(f) for f in filters}
        if len(keys) == 1:
            self._suspects -= keys

    def is_suspect(self, key: CoverageKey) -> bool:
        return key in self._suspects

    @property
    def suspects(self) -> bool:
        return bool(self._suspects)

    def goes_alone(self, f: Filter) -> bool:
        """A shape this relay refused once, or one under suspicion: never in a REQ with
        other shapes."""
        key = coverage_key(f)
        return key in self._refused or key in self._suspects

    def pack_key(self, f: Filter):
        """``filter_plan.pack_into_reqs``' key for live REQs: a shape that goes alone is
        packed apart, its filters together, the rest by their ``limit`` as always. Packed
        with the others and split when opened (``separate``), a REQ of three shapes took
        three subscriptions, so a count of live REQs read before opening (a consolidation's
        baseline) was a third of what opening took: a relay taking three filters a REQ was
        consolidated every ten minutes for days, each time to the same subscriptions, each
        time with a catch-up of a hundred REQs, its historic sync never done (the simulator,
        seed 983 of the 30-relay world, relay24)."""
        if not self._refused and not self._suspects:
            return f.limit
        return f.limit, coverage_key(f) if self.goes_alone(f) else None

    def separate(self, group: Sequence[Filter]) -> list[list[Filter]]:
        """``group`` as REQs in which a once-refused or suspect shape is alone (one REQ per
        such shape, the rest together); ``[group]`` when it holds none."""
        if not self._refused and not self._suspects:
            return [list(group)]
        rest = [f for f in group if not self.goes_alone(f)]
        alone = [[group[i] for i in idx] for idx in by_shape(group) if self.goes_alone(group[idx[0]])]
        return ([rest] if rest else []) + alone

    def due_probes(self, now: float) -> list[CoverageKey]:
        """Keys whose pause is over: probe each once now (they stay paused meanwhile)."""
        due = [key for key, until in self._until.items() if now >= until]
        for key in due:
            del self._until[key]
            self._probing.add(key)
        return due

    def probe_passed(self, key: CoverageKey) -> None:
        """The probe was served: the coverage is restored."""
        self._probing.discard(key)
        self._kinds_refused.discard(key)

    def lift(self, explained) -> list[CoverageKey]:
        """Lift every pause whose key ``explained(key)`` says was refused for a reason now
        known and answered (its refusals forgotten too); the keys lifted."""
        lifted = [key for key in {*self._until, *self._probing} if explained(key)]
        for key in lifted:
            self._until.pop(key, None)
            self._probing.discard(key)
            self._kinds_refused.discard(key)
        self._refused = {key for key in self._refused if not explained(key)}
        self._suspects = {key for key in self._suspects if not explained(key)}
        return sorted(lifted, key=repr)

    def abandon_probes(self) -> None:
        """The probes' answers will never come (the connection ended, or the daily fresh
        start dropped them): each is due again at once."""
        for key in self._probing:
            self._until[key] = 0.0
        self._probing.clear()

    def snapshot(self) -> list:
        """JSON-able, for ``state_dir``: ``[[kinds or null, [tag names], ids, authors],
        probe due at]``, and ``true`` after it when it was refused without notes too
        (``kinds_refused``); a probe out now is due at once after a restart (its answer is
        lost)."""
        due = [*self._until.items(), *((key, 0.0) for key in self._probing)]
        return [[_key_json(key), until, *[True] * (key in self._kinds_refused)] for key, until in due]

    def key(self) -> tuple | None:
        """What ``snapshot`` is made of, as one comparable value (None: nothing paused)."""
        if not (self._until or self._probing):
            return None
        return tuple(self._until.items()), frozenset(self._probing), frozenset(self._kinds_refused)

    @classmethod
    def restore(cls, saved) -> CoveragePauses:
        pauses = cls()
        for saved_key, until, *kinds_refused in saved:
            key = _json_key(saved_key)
            pauses._until[key] = float(until)
            if kinds_refused == [True]:
                pauses._kinds_refused.add(key)
        return pauses

    def keys(self) -> list[CoverageKey]:
        return list(self._until) + list(self._probing)

    def last_due(self) -> float:
        """When the last of its probes is due (0: nothing paused, or a probe out now)."""
        return max(self._until.values(), default=0.0)

    def __len__(self) -> int:
        return len(self._until) + len(self._probing)

    def __bool__(self) -> bool:  # (asked of every relay at every tick: run_policy_probes)
        return bool(self._until or self._probing)


def _key_json(key: CoverageKey) -> list:
    kinds, tags, ids, authors = key
    return [None if kinds is None else list(kinds), list(tags), ids, authors]


def _json_key(saved) -> CoverageKey:
    """``_key_json``'s key again, from what a state file holds."""
    kinds, tags, ids, authors = saved
    return None if kinds is None else tuple(int(k) for k in kinds), tuple(str(t) for t in tags), bool(ids), bool(authors)


@dataclass
class Trials:
    """One session's trials: a suspect shape (``CoveragePauses.suspect``) asked alone by a
    live REQ whose verdict (EOSE: served, CLOSED: refused) the other live REQs of that shape
    wait for. Without it, a shape refused in two REQs sent together (a fresh start's live
    coverage) was asked alone once for each, and once more by coverage added before the
    first verdict: three asks of a refused shape within a second (seed 9's year, day
    241.93). The wait has a deadline: a relay that never answers the trial (no EOSE, no
    CLOSED) would hold the others — live coverage never sent — for the whole connection.
    ``REQ_STALL_SECS`` after the trial went, its silence counts as "not refused": the
    REQs it held go (``overdue``; the shape stays suspect until a verdict comes)."""

    # suspect key -> (the trial's sub id, until when its verdict is waited for; None: no
    # longer, the REQs it held were let go)
    _open: dict[CoverageKey, tuple[str, float | None]] = field(default_factory=dict)

    def __contains__(self, sub_id: str) -> bool:
        """Is ``sub_id`` a trial (its verdict may let REQs go)?"""
        return any(trial == sub_id for trial, _ in self._open.values())

    def __len__(self) -> int:
        return len(self._open)

    def holds(self, pauses: CoveragePauses, open_subs, sub_id: str, filters: Sequence[Filter], now: float) -> bool:
        """Must the live REQ ``sub_id`` of ``filters`` wait? Yes while it asks a suspect
        shape whose verdict another REQ, open on the relay (``open_subs``), is out to get,
        and that REQ went less than ``REQ_STALL_SECS`` ago. Otherwise its suspect shapes
        not yet on trial are on trial by it from ``now`` (it goes). A trial ended — its REQ
        closed, or its shape cleared or paused — is dropped."""
        for key, (trial, _) in list(self._open.items()):
            if trial not in open_subs or not pauses.is_suspect(key):
                del self._open[key]
        keys = {key for key in map(coverage_key, filters) if pauses.is_suspect(key)}
        waits = False
        for key in keys:
            trial, until = self._open.get(key, (sub_id, None))
            if trial != sub_id and until is not None and now < until:
                waits = True
        if waits:
            return True
        for key in keys - self._open.keys():
            self._open[key] = (sub_id, now + REQ_STALL_SECS)
        return False

    def overdue(self, now: float) -> bool:
        """Did a trial's wait end (``REQ_STALL_SECS`` without a verdict) since last asked?
        Then the REQs it held go now (the caller pumps them)."""
        late = [key for key, (_, until) in self._open.items() if until is not None and now >= until]
        for key in late:
            self._open[key] = (self._open[key][0], None)
        return bool(late)


def regroup_parts(pauses: CoveragePauses, stalled_shapes, group: Sequence[Filter]) -> list[list[int]] | None:
    """A queued REQ's filters (``group``) against what the relay taught us since it was
    queued: indices into ``group``, one list a REQ; shapes ``pauses`` holds go, and a
    shape that stalled on this connection (``stalled_shapes``) or goes alone
    (``CoveragePauses.goes_alone``) goes alone. None: it goes as it is."""
    keep = [i for i, f in enumerate(group) if not pauses.is_filter_paused(f)]
    alone = [i for i in keep if coverage_key(group[i]) in stalled_shapes or pauses.goes_alone(group[i])]
    rest = [i for i in keep if i not in alone]
    apart = [[alone[j] for j in idx] for idx in by_shape([group[i] for i in alone])]  # (no rest: a REQ a shape)
    parts = [rest, *([i] for i in alone)] if rest else apart if len(apart) > 1 else [keep]
    return None if parts == [list(range(len(group)))] else parts
