"""Which paths brought events again: reads ``bench/_gsync_eventlog.py``'s log.

    python bench/_eventlog_report.py LOG [--top 25]

Each event's first arrival is "first"; every later one is a copy, counted by what brought it
(the batch's kind/method/flags/by-id-or-filter/tags/kinds, as logged) and by whether the same
relay had brought it before ("same relay") or only another relay ("other relay"); and by
what brought its first arrival (the path it duplicated)."""
from __future__ import annotations

import argparse
import collections


def report(path: str, top: int = 25) -> list[str]:
    first: dict[str, tuple[float, str, str]] = {}
    seen_on: dict[str, set[str]] = collections.defaultdict(set)
    firsts = collections.Counter()
    again = collections.Counter()
    pairs = collections.Counter()
    chosen: dict[tuple[str, str], float] = {}  # (relay, batch id) → when its methods were chosen
    timing = collections.Counter()
    total = 0
    with open(path) as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "#method" and len(parts) >= 4:
                chosen.setdefault((parts[2], parts[3]), float(parts[1]))
                continue
            if len(parts) != 5:
                continue
            t, relay, sub, event_id, what = parts
            total += 1
            if event_id not in first:
                first[event_id] = (float(t), relay, what)
                firsts[what] += 1
            else:
                where = "same relay" if relay in seen_on[event_id] else "other relay"
                again[(what, where)] += 1
                pairs[(first[event_id][2], what)] += 1
                timing[_timing(where, first[event_id][0], chosen, relay, sub)] += 1
            seen_on[event_id].add(relay)
    out = [f"event log {path}: {total:,} received, {len(first):,} distinct, "
           f"{total / max(1, len(first)):.2f} a distinct event"]
    out.append("  copies by cause (per distinct event):")
    out += [f"    {n:7,}  {n / max(1, len(first)):.2f}  {cause}" for cause, n in causes(again).most_common()]
    out.append("  first arrivals by path:")
    out += [f"    {n:7,}  {what}" for what, n in firsts.most_common(top)]
    out.append("  copies by path (and whether that relay had sent it before):")
    out += [f"    {n:7,}  {what}  [{where}]" for (what, where), n in again.most_common(top)]
    out.append("  copies by timing (known: the first arrival came before the copy's batch chose its methods,"
               " so the planner priced it in; concurrent: it came after):")
    out += [f"    {n:7,}  {n / max(1, len(first)):.2f}  {cause}" for cause, n in timing.most_common()]
    out.append("  copies by (path of the first arrival -> path of the copy):")
    out += [f"    {n:7,}  {a}  ->  {b}" for (a, b), n in pairs.most_common(top)]
    return out


def cause_of(what: str, where: str) -> str:
    """The cause of a copy, from the path that brought it (``_gsync_eventlog``'s field)."""
    if what in ("live", "nobatch"):
        return f"{what} subscription"
    kind, method, flags, by, *_ = what.split("/") + ["", "", "", ""]
    if where == "same relay":
        return ("same relay again: descendants' filters" if "D" in flags
                else "same relay again: another filter of it (layer 2 vs layer 3)")
    if by == "ids":
        return "other relay: NIP-77 id fetch"
    if "S" in flags:
        return ("other relay: a follower that waited too long, then went" if "F" in flags
                else "other relay: a follower that went at once (waiting priced above its copies)")
    if "F" in flags:
        return "other relay: a follower after its wait (checked by filter pages)"
    if "D" in flags:
        return "other relay: descendants' filters"
    if method == "NEGENTROPY":
        return "other relay: NIP-77 batch, missing fetched by filter"
    return f"other relay: a {kind.lower()} batch leading (no lead known when it began)"


def causes(again: collections.Counter) -> collections.Counter:
    out = collections.Counter()
    for (what, where), n in again.items():
        out[cause_of(what, where)] += n
    return out


def _timing(where: str, first_at: float, chosen: dict, relay: str, sub: str) -> str:
    if where == "same relay":
        return "same relay (its own filters overlap)"
    batch = sub[1:].split("-", 1)[0] if sub.startswith("h") else None
    at = chosen.get((relay, batch))
    if at is None:
        return "other relay, batch chose no method (REQ pages only)"
    return "other relay, known at the choice" if first_at <= at else "other relay, concurrent (came after the choice)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print("\n".join(report(args.log, args.top)))


if __name__ == "__main__":
    main()
