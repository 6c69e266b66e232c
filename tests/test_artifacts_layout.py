"""The layering of trained-model code: ``hub/`` (translating) and ``export/`` (shipping) both
build on ``artifacts/`` (checkpoints, model directories, the text pipeline, export layouts) and
neither imports the other, so there is no import circle; both raise the one error type. The
exporters build on ``artifacts/``, never on each other, and ``files/`` keeps generic chores."""

from __future__ import annotations

import ast
from pathlib import Path

from cli import REPO

PLUGIN = REPO / "user_plugin"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``user_plugin`` module that ``path`` imports, at any place in the file (relative
    imports resolved; ``from package import name`` counts as the package and, when it is a
    module, ``package.name``)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] == "user_plugin"}


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PLUGIN.rglob("*.py")}
    return {name: {m for m in imported_modules(path) if m in modules and m != name}
            for name, path in modules.items()}


def reaches(graph: dict[str, set[str]], start: str, prefix: str) -> list[str]:
    """The modules under ``prefix`` that ``start`` imports, directly or through others."""
    seen, stack = set(), [start]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return sorted(m for m in seen if m.startswith(prefix))


def test_the_graph_parser_sees_relative_imports():
    graph = import_graph()
    assert "user_plugin.artifacts.text_pipeline" in graph["user_plugin.hub.translator"]
    assert "user_plugin.artifacts.checkpoints" in graph["user_plugin.hub.loader"]


def test_no_import_circle_between_hub_and_export():
    graph = import_graph()
    hub = [m for m in graph if m.startswith("user_plugin.hub")]
    export = [m for m in graph if m.startswith("user_plugin.export")]
    assert hub and export
    assert {m: reaches(graph, m, "user_plugin.export") for m in hub
            if reaches(graph, m, "user_plugin.export")} == {}
    assert {m: reaches(graph, m, "user_plugin.hub") for m in export
            if reaches(graph, m, "user_plugin.hub")} == {}


def test_artifacts_import_neither_hub_nor_export():
    graph = import_graph()
    for module in (m for m in graph if m.startswith("user_plugin.artifacts")):
        assert reaches(graph, module, "user_plugin.hub") == []
        assert reaches(graph, module, "user_plugin.export") == []


def test_errors_have_one_type():
    """Trained-model files have one error type under one name: no module defines or aliases
    another name for it (the hub re-exports it as it is)."""
    import re

    from user_plugin import hub
    from user_plugin.artifacts.errors import ArtifactError
    from user_plugin.files.errors import UserError

    assert hub.ArtifactError is ArtifactError
    assert issubclass(ArtifactError, UserError) and issubclass(ArtifactError, RuntimeError)
    alias = re.compile(r"^\w+ = ArtifactError$|import ArtifactError as |class \w+\(ArtifactError",
                       re.MULTILINE)
    package = REPO / "user_plugin"
    assert [str(path.relative_to(package)) for path in sorted(package.rglob("*.py"))
            if alias.search(path.read_text(encoding="utf-8"))] == []


EXPORTERS = ("user_plugin.export.fairseq_checkpoint", "user_plugin.export.ctranslate2_model",
             "user_plugin.export.transformers_model")


def test_exporters_build_on_artifacts_never_on_each_other():
    """Loading our model, the mapping to fairseq's transformer and the probe batch are in
    ``artifacts/``; an exporter does not reach into another."""
    graph = import_graph()
    for exporter in EXPORTERS:
        others = [m for m in reaches(graph, exporter, "user_plugin.export") if m in EXPORTERS]
        assert others == [], exporter
        assert "user_plugin.artifacts.our_model" in graph[exporter], exporter


def test_files_keep_generic_chores_only():
    """Checkpoints, fingerprints, averaging and the built-in mapping are trained-model files
    (``artifacts/``); ``files/`` imports none of it."""
    graph = import_graph()
    files = [m for m in graph if m.startswith("user_plugin.files")]
    assert "user_plugin.files.atomic" in files
    assert not [m for m in files if m.rpartition(".")[2] in ("checkpoints", "fingerprint")]
    assert {m: reaches(graph, m, "user_plugin.artifacts") for m in files
            if reaches(graph, m, "user_plugin.artifacts")} == {}
    for module in ("checkpoints", "fingerprint", "averaging", "builtin_transformer", "our_model"):
        assert f"user_plugin.artifacts.{module}" in graph, module
