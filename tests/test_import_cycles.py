"""No import circle in user_plugin/: the graph of every import statement (at module level or
inside a function alike), read from the source with ``ast``, has no cycle."""

import ast
from pathlib import Path

from cli import REPO

PACKAGE = REPO / "user_plugin"

def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set) -> set:
    """The plugin's modules that module ``name`` (file ``path``) imports anywhere."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {target for target in found if target in known and target != name}


def import_graph() -> dict:
    paths = modules()
    return {name: imported(name, path, set(paths)) for name, path in paths.items()}


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_plugins_imports():
    graph = import_graph()
    assert "user_plugin.fairseq_patches" in graph["user_plugin.registration"]
    assert "user_plugin.models.blocks" in graph["user_plugin.models.vaswani_transformer"]
    assert "user_plugin.safe_loading" in graph["user_plugin.artifacts.checkpoints"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_plugin():
    assert cycles(import_graph()) == []
