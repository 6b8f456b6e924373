"""Every third-party package that gsync, its scripts or its tests import is named by setup.py
(``install_requires`` or an extra): a module that imports one nothing installs passes on a
machine that happens to carry it and fails in a fresh virtual environment (the README's
test command, `.ci/run`)."""
import ast
import os
import re
import sys
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("gsync", "tests", "bench", "bin")

# Import names whose distribution is named otherwise, for when it is not installed here.
_DISTRIBUTION_OF = {"websocket": "websocket-client", "xdist": "pytest-xdist",
                    "prometheus_client": "prometheus-client", "nostr_sdk": "nostr-sdk"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions setup.py's ``install_requires`` and extras name."""
    tree = ast.parse(open(os.path.join(ROOT, "setup.py")).read())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    names = set()
    for keyword in call.keywords:
        if keyword.arg in ("install_requires", "extras_require"):
            value = ast.literal_eval(keyword.value)
            requirements = [r for group in value.values() for r in group] if isinstance(value, dict) else value
            names.update(_norm(re.match(r"\s*([A-Za-z0-9_.\-]+)", r).group(1)) for r in requirements)
    return names


def _sources():
    for top in CHECKED:
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(directory, name)
                if name.endswith(".py") or (top == "bin" and open(path, "rb").read(2) == b"#!"
                                            and b"python" in open(path, "rb").readline()):
                    yield path


def imports(path: str):
    """(line, top-level name) of every absolute import in the file, at any depth."""
    for node in ast.walk(ast.parse(open(path, "rb").read(), path)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def _local_names() -> set[str]:
    names = {entry[:-3] if entry.endswith(".py") else entry for entry in os.listdir(ROOT)}
    for top in CHECKED:
        for _, _, files in os.walk(os.path.join(ROOT, top)):
            names.update(name[:-3] for name in files if name.endswith(".py"))
    return names


def undeclared() -> list[str]:
    known = declared()
    local = _local_names()
    installed = metadata.packages_distributions()
    found = []
    for path in _sources():
        for line, name in imports(path):
            if name in sys.stdlib_module_names or name in local or name == "__future__":
                continue
            distributions = installed.get(name) or [_DISTRIBUTION_OF.get(name, name)]
            if not known & {_norm(d) for d in distributions}:
                found.append(f"{os.path.relpath(path, ROOT)}:{line}: import {name} "
                             f"({', '.join(distributions)}) is named by no extra of setup.py")
    return found


def test_every_third_party_import_is_declared_in_setup_py():
    assert undeclared() == []


def test_the_check_finds_an_undeclared_import(tmp_path, monkeypatch):
    """The check has teeth: a module importing a package setup.py does not name is reported."""
    (tmp_path / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='x', install_requires=['gevent>=1'],"
        " extras_require={'test': ['pytest']})\n")
    (tmp_path / "gsync").mkdir()
    (tmp_path / "gsync" / "mod.py").write_text(
        "import os\nimport gevent\nimport pytest\n\ndef f():\n    import requests.adapters\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert [row.split(": ", 1)[0] for row in undeclared()] == ["gsync/mod.py:6"]
