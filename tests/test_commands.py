"""The installed commands as declared (``setup.py``'s console scripts), without installing: each
points at a function that exists, in a module of ``user_plugin/commands/``, the recipes and docs
name only declared commands, nothing imports a file of ``scripts/``, and ``python -m user_plugin``
prints the ``--user-dir`` path.
(``tests/test_installed_commands.py`` installs the package for real.)"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

import forked_cli
import pytest
from cli import REPO

#: A command's name in prose (not a format name such as ``vaswani-model/1``, nor a file name).
COMMAND_WORD = re.compile(r"(?<![\w./-])vaswani-[a-z][a-z0-9-]*[a-z0-9](?![\w/-]|\.\w)")


def console_scripts() -> dict:
    """``{command: "module:function"}`` as ``setup.py`` declares them (read, not run)."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            entry_points = ast.literal_eval(node.value)
            pairs = (line.split("=", 1) for line in entry_points["console_scripts"])
            return {name.strip(): target.strip() for name, target in pairs}
    raise AssertionError("setup.py declares no entry_points")


def test_every_console_script_names_a_function_of_the_package():
    scripts = console_scripts()
    assert "vaswani-user-dir" in scripts and len(scripts) >= 12
    for name, target in scripts.items():
        assert re.fullmatch(r"vaswani(-[a-z]+)+", name), name
        module_name, _, function = target.partition(":")
        assert module_name.startswith("user_plugin."), target
        assert callable(getattr(importlib.import_module(module_name), function)), target


def test_every_console_script_lives_in_commands_and_has_one_error_convention():
    """Each installed command's module is in ``user_plugin/commands/`` and its entry point is
    the module's ``cli_main``: bad input as one ``PROG: error: ...`` line and status 1
    (:func:`~user_plugin.files.errors.console_script`); ``main(argv)`` for use from Python."""
    for target in console_scripts().values():
        module_name, _, function = target.partition(":")
        assert module_name.rpartition(".")[0] == "user_plugin.commands", target
        assert function == "cli_main", target
        module = importlib.import_module(module_name)
        assert callable(getattr(module, "main", None)), target
    assert not [path.name for path in (REPO / "user_plugin").rglob("cli.py")]


def test_recipes_and_docs_name_only_declared_commands():
    declared = set(console_scripts())
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "recipes").rglob("*.sh"))]
    used = {}
    for path in texts:
        for word in COMMAND_WORD.findall(path.read_text(encoding="utf-8")):
            used.setdefault(word, path.relative_to(REPO))
    assert {"vaswani-plot-training", "vaswani-ablation-table"} <= set(used)
    unknown = {word: str(path) for word, path in used.items() if word not in declared}
    assert unknown == {}


@pytest.mark.parametrize("folder", ["tests", "scripts", "user_plugin", "examples"])
def test_nothing_imports_a_script(folder):
    """A script is a program, not a library: no ``sys.path`` entry for ``scripts/``, no import
    of one of its modules by name or by file."""
    script_modules = {p.stem for p in (REPO / "scripts").rglob("*.py")}
    offenders = []
    for path in sorted((REPO / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if re.search(r"""sys\.path\.insert\([^)\n]*["']scripts["']""", text):
            offenders.append(f"{path.relative_to(REPO)}: puts scripts/ on sys.path")
        if re.search(r"""spec_from_file_location\([^)]*["']scripts["']""", text):
            offenders.append(f"{path.relative_to(REPO)}: loads a file of scripts/ as a module")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "scripts" or (top in script_modules and path.parent.name != "gpu_check"):
                    offenders.append(f"{path.relative_to(REPO)}: imports {name}")
    assert offenders == []


def test_python_dash_m_user_plugin_prints_the_user_dir(tmp_path):
    proc = forked_cli.run([sys.executable, "-m", "user_plugin"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    printed = Path(proc.stdout.strip())
    assert printed == REPO / "user_plugin"
    assert (printed / "__init__.py").is_file() and (printed / "models").is_dir()


def test_readme_and_docs_point_at_files_that_exist():
    """Every relative link of the README and of docs/, and every test file the README's claim
    table names, exists (the front page stays true as files move)."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if not target.startswith(("http://", "https://")) and \
                    not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
        for pattern in re.findall(r"`(tests/[\w*]+\.py)`", text):
            if not list(REPO.glob(pattern)):
                broken.append(f"{page.relative_to(REPO)}: {pattern}")
    assert broken == []
    claims = (REPO / "README.md").read_text(encoding="utf-8").split(
        "## Correctness, proven by tests", 1)[1]
    assert len(re.findall(r"`tests/[\w*]+\.py`", claims)) >= 20
