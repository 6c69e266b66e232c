"""The layers: library code changes nothing in fairseq when imported; only the entry points
register the plugin (registration.register()) and install the patch table's rows."""

from __future__ import annotations

import ast
import json
import sys

import forked_cli
from cli import REPO

PLUGIN = REPO / "user_plugin"
#: The library layers, below the entry points (commands, hub, tasks' load_plugin).
LIBRARY_LAYERS = ("artifacts", "optimizers", "models", "modules", "files", "generation",
                  "measurement", "criterions", "lr_schedulers", "parsing", "serving")
#: Layers that must not even name registration or the patch table.
LOWER_LAYERS = ("artifacts", "optimizers", "models", "modules", "files")

IMPORT_EVERY_LIBRARY_MODULE = r"""
import importlib, json, pkgutil, sys
import fairseq.checkpoint_utils, fairseq.trainer, fairseq_cli.train, fairseq.sequence_generator
from user_plugin.fairseq_patches import PATCHES, _owner_and_attribute

def identities():
    found = {}
    for patch in PATCHES:
        for replacement in patch.replaces:
            try:
                owner, attribute = _owner_and_attribute(replacement.target)
            except Exception:
                continue
            found[replacement.target] = id(getattr(owner, attribute, None))
    return found

before = identities()
imported = []
for layer in sys.argv[1].split(","):
    package = importlib.import_module(f"user_plugin.{layer}")
    for info in pkgutil.walk_packages(package.__path__, f"user_plugin.{layer}."):
        if info.name.endswith("__main__") or info.name.endswith("train_step_probe"):
            continue
        importlib.import_module(info.name)
        imported.append(info.name)
from user_plugin import fairseq_patches, registration
print(json.dumps({
    "changed": sorted(t for t, i in identities().items() if before.get(t) != i),
    "installed": list(fairseq_patches.installed()),
    "registered": registration._registered,
    "imported": len(imported),
}))
"""


def test_importing_every_library_module_installs_no_patch_and_registers_nothing():
    proc = forked_cli.run([sys.executable, "-c", IMPORT_EVERY_LIBRARY_MODULE,
                           ",".join(LIBRARY_LAYERS)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["imported"] > 40
    assert report == {**report, "changed": [], "installed": [], "registered": False}


def test_the_entry_points_register_once_and_install_the_table():
    code = ("import json, sys; from user_plugin.registration import register; register(); "
            "hook = sys.excepthook; register(); from user_plugin import fairseq_patches; "
            "print(json.dumps({'n': len(fairseq_patches.installed()), "
            "'same_hook': sys.excepthook is hook}))")
    proc = forked_cli.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from user_plugin.fairseq_patches import PATCHES

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"n": len(PATCHES),
                                                                 "same_hook": True}


def test_no_lower_layer_imports_registration_or_the_patch_table():
    found = []
    for layer in LOWER_LAYERS:
        for path in sorted((PLUGIN / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [alias.name for alias in node.names]
                if any("registration" in name or "fairseq_patches" in name for name in names):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_fairseqs_checkpoint_names_are_parsed_in_one_module():
    """Every pattern of fairseq's checkpoint file names lives in files/checkpoint_names.py."""
    grammar = PLUGIN / "files" / "checkpoint_names.py"
    found = []
    for path in sorted(PLUGIN.rglob("*.py")):
        if path == grammar:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in (
                    "compile", "fullmatch", "match", "search") and node.args \
                    and isinstance(node.args[0], ast.Constant) \
                    and "checkpoint" in str(node.args[0].value) \
                    and ".pt" in str(node.args[0].value):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
    assert "re.compile" in grammar.read_text(encoding="utf-8")
