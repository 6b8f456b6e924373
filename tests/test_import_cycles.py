"""No module of gsync imports, directly or through others, one that imports it back: an
import circle (such as io.runner and ops.cli had) leaves one of them half-initialised at
import time and ties two layers together. Function-level imports count too."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gsync")


def _modules(root: str) -> dict[str, str]:
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path[:-3], os.path.dirname(root)).replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def import_graph(root: str = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    graph = {module: set() for module in modules}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in modules else name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_gsync_has_no_import_circle():
    assert cycles(import_graph()) == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / "gsync"
    (package / "io").mkdir(parents=True)
    (package / "ops").mkdir()
    for init in (package, package / "io", package / "ops"):
        (init / "__init__.py").write_text("")
    (package / "io" / "runner.py").write_text("def f():\n    from ..ops.cli import CODE\n")
    (package / "ops" / "cli.py").write_text("CODE = 1\n\ndef main():\n    from ..io import runner\n")
    (package / "ops" / "exits.py").write_text("from . import cli\n")
    assert cycles(import_graph(str(package))) == [["gsync.io.runner", "gsync.ops.cli"]]
