#!/usr/bin/env python3
"""Counts of how the manager's state is shared (issue 27), read from the source with ``ast``.

    python bench/structure.py [--repo DIR]

Prints: attributes set on ``SyncManager`` (``self.x = …`` in ``gsync/io/manager/``, its
mixins' included where it has any), how many of them more than one of its modules touches;
the collaborators it owns (``self.x = SomeClass(…)`` for a class of ``gsync/io/manager/``)
with the attributes each sets on itself, split into those given to its constructor and
those it owns; fields of ``RelayState`` (and of ``RelaySession`` when there is one), how
many more than one manager module (one collaborator each, but ``core.py``, the manager)
touches and how many more than one module of ``gsync/`` assigns; where ``.status`` is
assigned; the longest functions in ``gsync/io/``; undeclared batch attributes read with
``getattr`` and sub-id prefixes tested with ``startswith``. Counts, not timings: the same on
any machine.
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


def self_attributes(cls: ast.ClassDef) -> tuple[set[str], set[str]]:
    """(attributes ``cls`` sets on itself from its ``__init__``'s parameters as they are,
    every other attribute it sets on itself)."""
    params: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            params = {a.arg for a in node.args.args + node.args.kwonlyargs}
    given: set[str] = set()
    owned: set[str] = set()
    for node in ast.walk(cls):
        for t in assigned_targets(node):
            for leaf in flatten(t):
                if not (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                        and leaf.value.id == "self"):
                    continue
                value = getattr(node, "value", None)
                if isinstance(value, ast.Name) and value.id in params and isinstance(node, ast.Assign):
                    given.add(leaf.attr)
                else:
                    owned.add(leaf.attr)
    return given, owned - given


def collaborators(manager) -> None:
    """The objects of ``gsync/io/manager/`` classes the manager keeps on itself, and what
    each is given and owns."""
    classes = {node.name: node for _, tree in manager for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)}
    built: dict[str, str] = {}
    given_to: dict[str, set[str]] = collections.defaultdict(set)  # manager attribute -> collaborators
    for _, tree in manager:
        for cls in ast.walk(tree):
            if not (isinstance(cls, ast.ClassDef) and cls.name == "SyncManager"):
                continue
            for node in ast.walk(cls):
                call = node.value if isinstance(node, ast.Assign) else None
                if isinstance(call, ast.BoolOp):  # ``x or Class(…)``
                    call = call.values[-1]
                if not (isinstance(call, ast.Call) and isinstance(call.func, (ast.Name, ast.Attribute))):
                    continue
                name = call.func.id if isinstance(call.func, ast.Name) else call.func.value.id \
                    if isinstance(call.func.value, ast.Name) else ""
                if name in classes:
                    for t in node.targets:
                        if isinstance(t, ast.Attribute):
                            built[t.attr] = name
                            for arg in ast.walk(call):
                                if (isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
                                        and arg.value.id == "self"):
                                    given_to[arg.attr].add(t.attr)
    print(f"collaborators the manager owns: {len(built)}")
    for attr, name in sorted(built.items()):
        given, owned = self_attributes(classes[name])
        print(f"  {attr} ({name}): {len(given)} given, {len(owned)} owned: {' '.join(sorted(owned))}")
    shared = sorted((a for a in given_to if len(given_to[a]) > 1), key=lambda a: (-len(given_to[a]), a))
    print(f"  manager attributes given to more than one collaborator: {len(shared)}: "
          + " ".join(f"{a}({len(given_to[a])})" for a in shared))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=".")
    root = pathlib.Path(ap.parse_args().repo)
    manager = list(modules(root, "gsync/io/manager"))

    # attributes set on self in SyncManager and its mixins, if any (the classes it derives from)
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
    beyond_core = sorted(a for a in set_on_self if len(self_touch[a] - {"core.py"}) > 1)
    print(f"  touched by more than one module besides core.py: {len(beyond_core)}")
    print(f"  mixins: {len(classes) - 1}")

    collaborators(manager)

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
        multi_beyond_core = sorted(f for f in fields if len(touch[f] - {"core.py"}) > 1)
        multi_set = sorted(f for f in fields if len(assigned[f]) > 1)
        print(f"{cls} fields: {len(fields)}")
        print(f"  touched by more than one manager module: {len(multi)} "
              f"({len(multi_beyond_core)} besides core.py)")
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
