#!/usr/bin/env python3
"""Compare collapsed stacks (``bench/scale --sample --keep``: WORKDIR/nN/*.stacks) of one
instance with those of the shards of the same command, frame by frame.

    bench/_stacks_report.py ONE.stacks SHARD0.stacks [SHARD1.stacks ...] [--self] [--top N]
                            [--under FRAME]

Per frame (``file:function``): samples (5 ms of CPU each) of the first file, then of each
other file, sorted by what the others spend more than the first. Inclusive (every stack the
frame is on, once) unless ``--self`` (the stacks it tops). ``--under FRAME`` counts only
stacks that go through a frame whose name contains FRAME."""
from __future__ import annotations

import sys
from collections import Counter


def load(path: str, self_only: bool, under: str | None) -> tuple[Counter, int]:
    counts: Counter = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not n.isdigit():
                continue
            names = stack.split(";")
            if under and not any(under in name for name in names):
                continue
            total += int(n)
            for name in ([names[-1]] if self_only else set(names)):
                counts[name] += int(n)
    return counts, total


def main(argv: list[str]) -> int:
    top, under = 40, None
    if "--top" in argv:
        at = argv.index("--top")
        top = int(argv[at + 1])
        del argv[at:at + 2]
    if "--under" in argv:
        at = argv.index("--under")
        under = argv[at + 1]
        del argv[at:at + 2]
    self_only = "--self" in argv
    loaded = [load(p, self_only, under) for p in argv if p != "--self"]
    print("samples (5 ms CPU each): " + " | ".join(f"{total:,}" for _, total in loaded))
    first, others = loaded[0][0], [c for c, _ in loaded[1:]]
    names = set(first).union(*others)
    for name in sorted(names, key=lambda k: -(sum(c[k] for c in others) - first[k]))[:top]:
        print(f"{sum(c[name] for c in others) - first[name]:+6}  {first[name]:6} | "
              + " | ".join(f"{c[name]:6}" for c in others) + f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
