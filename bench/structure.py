#!/usr/bin/env python3
"""Counts of how the manager's state is shared (issue 27), read from the source with ``ast``.

    python bench/structure.py [--repo DIR]

Prints: attributes set on ``SyncManager`` (``self.x = …`` in ``gsync/io/manager/``), how
many of them more than one of its modules touches; fields of ``RelayState`` (and of
``RelaySession`` when there is one), how many more than one manager module touches and how
many more than one module of ``gsync/`` assigns; where ``.status`` is assigned; the
longest functions in ``gsync/io/``; undeclared batch attributes read with ``getattr`` and
sub-id prefixes tested with ``startswith``. Counts, not timings: the same on any machine.
"""
from __future__ import annotations

import argparse
import ast
import collections
import pathlib
import re


def modules(root: pathlib.Path, under: str):
    for path in sorted((root / under).rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def dataclass_fields(root: pathlib.Path, name: str) -> list[str]:
    for _, tree in modules(root, "gsync"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return [s.target.id for s in node.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    return []


def assigned_targets(node):
    if isinstance(node, (ast.Assign,)):
        return node.targets
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def flatten(target):
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from flatten(t)
    else:
        yield target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=".")
    root = pathlib.Path(ap.parse_args().repo)
    manager = list(modules(root, "gsync/io/manager"))

    # attributes set on self in SyncManager and its mixins (the classes it derives from)
    classes = {"SyncManager"}
    for _, tree in manager:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "SyncManager":
                classes |= {b.id for b in node.bases if isinstance(b, ast.Name)}
    set_on_self: set[str] = set()
    self_touch: dict[str, set[str]] = collections.defaultdict(set)
    for path, tree in manager:
        for cls in ast.walk(tree):
            if not (isinstance(cls, ast.ClassDef) and cls.name in classes):
                continue
            for node in ast.walk(cls):
                for t in assigned_targets(node):
                    for leaf in flatten(t):
                        if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                                and leaf.value.id == "self"):
                            set_on_self.add(leaf.attr)
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "self"):
                    self_touch[node.attr].add(path.name)
    shared_attrs = sorted(a for a in set_on_self if len(self_touch[a]) > 1)
    print(f"SyncManager attributes set on self: {len(set_on_self)}")
    print(f"  touched by more than one manager module: {len(shared_attrs)}: {' '.join(shared_attrs)}")
    mixins = sorted(a for a in set_on_self if len(self_touch[a] - {"core.py"}) > 1)
    print(f"  touched by more than one module besides core.py: {len(mixins)}")

    for cls in ("RelayState", "RelaySession"):
        fields = dataclass_fields(root, cls)
        if not fields:
            continue
        touch: dict[str, set[str]] = collections.defaultdict(set)
        assigned: dict[str, set[str]] = collections.defaultdict(set)
        for path, tree in manager:
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in fields and not (
                        isinstance(node.value, ast.Name) and node.value.id == "self"):
                    touch[node.attr].add(path.name)
        for path, tree in modules(root, "gsync"):
            for node in ast.walk(tree):
                for t in assigned_targets(node):
                    for leaf in flatten(t):
                        own = isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) \
                            and leaf.value.id == "self" and path.name != "relay_state.py"
                        if isinstance(leaf, ast.Attribute) and leaf.attr in fields and not own:
                            assigned[leaf.attr].add(str(path.relative_to(root)))
        multi = sorted(f for f in fields if len(touch[f]) > 1)
        multi_mixin = sorted(f for f in fields if len(touch[f] - {"core.py"}) > 1)
        multi_set = sorted(f for f in fields if len(assigned[f]) > 1)
        print(f"{cls} fields: {len(fields)}")
        print(f"  touched by more than one manager module: {len(multi)} "
              f"({len(multi_mixin)} besides core.py)")
        print(f"  assigned in more than one module of gsync/: {len(multi_set)}: {' '.join(multi_set)}")

    status_sets = []
    for path, tree in modules(root, "gsync"):
        for node in ast.walk(tree):
            for t in assigned_targets(node):
                for leaf in flatten(t):
                    if isinstance(leaf, ast.Attribute) and leaf.attr == "status" and not (
                            isinstance(leaf.value, ast.Name) and leaf.value.id == "self"):
                        status_sets.append(f"{path.relative_to(root)}:{node.lineno}")
    files = {s.rsplit(':', 1)[0] for s in status_sets}
    print(f".status assignments: {len(status_sets)} in {len(files)} files")

    lengths = []
    for path, tree in modules(root, "gsync/io"):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root)}:{node.name}"))
    lengths.sort(reverse=True)
    print("longest functions in gsync/io/: " + ", ".join(f"{n} {where}" for n, where in lengths[:3]))
    print(f"  functions over 50 lines: {sum(1 for n, _ in lengths if n > 50)}")

    text = "\n".join(p.read_text() for p, _ in modules(root, "gsync"))
    print("getattr(b|batch, …): " + str(len(re.findall(r"getattr\((?:b|batch),", text))))
    print("sub-id prefix tests (startswith(\"neg\"|\"h\"|\"p\")): "
          + str(len(re.findall(r"startswith\(\(?\"(?:neg|h|p)\"", text))))


if __name__ == "__main__":
    main()
