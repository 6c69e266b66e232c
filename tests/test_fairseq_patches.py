"""The plugin's patches of fairseq (user_plugin/fairseq_patches): every attribute the plugin
replaces is a row of the one table, every replacement lives in the package, each row says which
runs it applies to and a row of our runs gives any other run fairseq's own function, the off
switch gives fairseq's own objects back (identity), and a fairseq version outside the checked
ones gives one warning line. (tests/test_stock_run_with_plugin.py runs a stock configuration in
a process that loaded the plugin.)"""

import json
import logging
import sys

import forked_cli
import pytest
from cli import REPO, fairseq_env

from user_plugin import fairseq_patches
from user_plugin.fairseq_patches import (
    ENV_VAR,
    EVERY_RUN,
    OUR_RUNS,
    PATCHES,
    Patch,
    PatchSwitchError,
    Replacement,
)

# Runs in a fresh process: snapshots the identity of every attribute of every loaded fairseq
# module and of the classes they define, of torch's top level, torch.Tensor and nn.Module, and
# sys.excepthook; loads the plugin with its patches off, then installs them, then removes them.
SNAPSHOTS = r"""
import importlib, inspect, json, sys
for name in ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive",
             "fairseq.trainer", "fairseq.checkpoint_utils", "fairseq.sequence_generator",
             "fairseq.search", "fairseq.ngram_repeat_block", "fairseq.logging.progress_bar",
             "fairseq.distributed.utils"):
    importlib.import_module(name)
import torch

def owners():
    found = {"sys": sys, "torch": torch, "torch.Tensor": torch.Tensor,
             "torch.nn.Module": torch.nn.Module}
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if module is None or name.split(".")[0] not in ("fairseq", "fairseq_cli"):
            continue
        found[name] = module
        for attr, value in list(vars(module).items()):
            if inspect.isclass(value) and value.__module__ == name:
                found[f"{name}.{attr}"] = value
    return found

OWNERS = owners()  # the objects as they are before the plugin loads

def snapshot():
    out = {}
    for owner_name, owner in OWNERS.items():
        items = {"excepthook": sys.excepthook} if owner is sys else dict(vars(owner))
        out[owner_name] = {a: id(v) for a, v in items.items() if not inspect.ismodule(v)}
    return out

def changed(before, after):
    names = set()
    for owner, attrs in before.items():
        for attr, ident in attrs.items():
            if after.get(owner, {}).get(attr) != ident:
                names.add(f"{owner}.{attr}")
        for attr in set(after.get(owner, {})) - set(attrs):
            names.add(f"{owner}.{attr}")
    return sorted(names)

before = snapshot()
from user_plugin.registration import register
register()  # VASWANI_FAIRSEQ_PATCHES=off: registers, patches nothing
from user_plugin import fairseq_patches
loaded_off = snapshot()
fairseq_patches.os.environ.pop("VASWANI_FAIRSEQ_PATCHES")
fairseq_patches.install()
installed = snapshot()
fairseq_patches.uninstall()
removed = snapshot()
print(json.dumps({
    "changed_by_loading_with_patches_off": changed(before, loaded_off),
    "changed_by_install": changed(loaded_off, installed),
    "changed_after_uninstall": changed(before, removed),
}))
"""


def run_python(code, env_value, *args):
    env = fairseq_env()
    env.pop(ENV_VAR, None)
    if env_value is not None:
        env[ENV_VAR] = env_value
    return forked_cli.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def table_targets():
    """Every attribute the table replaces, once (two rows may wrap the same one in turn)."""
    return sorted({r.dotted for patch in PATCHES for r in patch.replaces})


@pytest.fixture(scope="module")
def snapshots():
    proc = run_python(SNAPSHOTS, "off")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_attribute_the_plugin_replaces_is_a_row_of_the_table(snapshots):
    assert snapshots["changed_by_install"] == table_targets()
    assert not any(target.startswith("torch") for target in snapshots["changed_by_install"])


def test_with_the_switch_off_loading_the_plugin_replaces_nothing(snapshots):
    assert snapshots["changed_by_loading_with_patches_off"] == []


def test_uninstall_gives_back_fairseqs_own_objects(snapshots):
    assert snapshots["changed_after_uninstall"] == []


IDENTITY_BY_NAME = r"""
import fairseq.checkpoint_utils as cu, fairseq_cli.train as ft, sys
from fairseq.trainer import Trainer
originals = {"train": ft.train, "train_step": Trainer.train_step,
             "init": Trainer.__init__, "load": cu.load_checkpoint, "hook": sys.excepthook}
from user_plugin.registration import register
register()
from user_plugin import fairseq_patches
now = {"train": ft.train, "train_step": Trainer.train_step,
       "init": Trainer.__init__, "load": cu.load_checkpoint, "hook": sys.excepthook}
print(json.dumps({"same": sorted(k for k in originals if originals[k] is now[k]),
                  "installed": list(fairseq_patches.installed())}))
""".replace("import fairseq", "import json\nimport fairseq", 1)


def test_switch_off_by_name_keeps_fairseqs_own_functions_for_those_only():
    proc = run_python(IDENTITY_BY_NAME,
                      "off:progress_report,mixed_precision,bf16_without_tpu,fp16_without_cuda")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["same"] == ["init", "train"]
    assert "progress_report" not in report["installed"]
    assert "mixed_precision" not in report["installed"]
    assert len(report["installed"]) == len(PATCHES) - 4


def test_a_misspelt_switch_is_one_error_line_naming_the_known_patches():
    proc = run_python("from user_plugin.registration import register; register()",
                      "off:progress_reprot")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "progress_reprot" in lines[0] and "progress_report" in lines[0]
    with pytest.raises(PatchSwitchError, match="expected 'on', 'off'"):
        fairseq_patches.disabled_by_environment("no")
    assert fairseq_patches.disabled_by_environment("on") == ()
    assert set(fairseq_patches.disabled_by_environment("off")) == {p.name for p in PATCHES}


def test_listing_says_what_is_on_and_what_each_patch_replaces():
    proc = run_python("import runpy; runpy.run_module('user_plugin.fairseq_patches', "
                      "run_name='__main__')", "off:replace_unk_flag")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{len(PATCHES) - 1} of {len(PATCHES)} patches on" in proc.stdout
    assert "[off] replace_unk_flag" in proc.stdout and "[on ] progress_report" in proc.stdout
    for target in table_targets():
        assert f"replaces {target} by user_plugin.fairseq_patches." in proc.stdout
    rows = proc.stdout.split("\n[")[1:]
    assert len(rows) == len(PATCHES)
    for patch, row in zip(PATCHES, rows):
        scope_line = row.splitlines()[1].strip()
        assert scope_line.startswith(f"scope: {patch.scope}"), row
        if patch.scope == OUR_RUNS:
            assert "(told by the " in scope_line, row


def test_every_row_says_what_it_fixes_where_it_was_checked_and_which_runs_it_applies_to():
    assert len({patch.name for patch in PATCHES}) == len(PATCHES)
    for patch in PATCHES:
        assert patch.replaces and len(patch.fixes) > 40 and patch.checked, patch.name
        assert patch.scope in (OUR_RUNS, EVERY_RUN), patch.name
        for replacement in patch.replaces:
            assert (replacement.ours is not None) == (patch.scope == OUR_RUNS), patch.name
    # what changes training or checkpoint bytes is ours only
    scopes = {patch.name: patch.scope for patch in PATCHES}
    for name in ("resume_plan", "one_line_checkpoint_save", "verified_checkpoint_load",
                 "mixed_precision", "optimizer_state_layouts", "progress_report",
                 "atomic_checkpoint_copy", "save_dir_lock", "ensemble_fingerprints"):
        assert scopes[name] == OUR_RUNS, name
    with pytest.raises(ValueError, match="how a call tells whose run it is"):
        Patch("unscoped", (Replacement("fairseq.utils:replace_unk", print),), "x" * 50,
              OUR_RUNS)


def test_every_replacement_lives_in_the_patches_package():
    """Each row's replacement is defined in user_plugin.fairseq_patches; with the snapshot test
    above (every attribute changed is a row's target), no module outside the package replaces
    an attribute of fairseq."""
    for patch in PATCHES:
        for replacement in patch.replaces:
            module = replacement.new.__module__
            assert module.startswith("user_plugin.fairseq_patches."), (patch.name, module)
            assert replacement.replacement.startswith(module)


def test_a_row_of_our_runs_gives_any_other_call_fairseqs_own_function():
    """The dispatch that every row of our runs goes through: the replacement for a call that
    its ``ours`` accepts, fairseq's original (the very object) for any other."""
    calls = []

    def original(run, value):
        calls.append(("fairseq", run, value))
        return "fairseq"

    def factory(wrapped):
        def replacement(run, value):
            calls.append(("ours", run, value))
            return wrapped(run, value)
        return replacement

    import types

    owner = types.SimpleNamespace(function=original)
    row = Patch("scoped", (Replacement("m:function", factory, lambda run, value: run == "ours"),),
                "a row used by this test only" * 2, OUR_RUNS)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(fairseq_patches, "_owner_and_attribute", lambda target, where=False:
                   (owner, "function"))
    try:
        fairseq_patches._install_patch(row)
        assert owner.function("stock", 1) == "fairseq" and calls == [("fairseq", "stock", 1)]
        calls.clear()
        assert owner.function("ours", 2) == "fairseq"
        assert calls == [("ours", "ours", 2), ("fairseq", "ours", 2)]
        assert owner.function.__wrapped__ is original
    finally:
        fairseq_patches.uninstall(("scoped",))
        monkey.undo()
    assert owner.function is original


def test_scope_tells_our_configurations_from_stock_ones():
    import argparse

    from user_plugin.registration import register

    register()  # our model and task registered
    from user_plugin.fairseq_patches import scope

    assert scope.is_our_run(argparse.Namespace(arch="vaswani_base", task="translation"))
    assert scope.is_our_run({"model": {"_name": "transformer"},
                             "task": {"_name": "vaswani_translation"}})
    assert not scope.is_our_run({"model": {"_name": "transformer"},
                                 "task": {"_name": "translation"}})
    assert not scope.is_our_run(argparse.Namespace(arch="transformer", task="translation"))
    assert not scope.is_our_run(None)
    assert not scope.saved_state({"cfg": {"model": {"_name": "transformer_iwslt_de_en"}}})
    assert scope.saved_state({"cfg": {"model": {"_name": "vaswani_big"}}})


@pytest.fixture
def replace_unk_patch_removed():
    """The replace_unk_flag patch taken out of this (test) process, put back afterwards."""
    fairseq_patches.uninstall(("replace_unk_flag",))
    yield
    fairseq_patches.uninstall(("replace_unk_flag",))
    fairseq_patches.install(only=lambda patch: patch.name == "replace_unk_flag")


def test_an_unchecked_fairseq_version_gives_one_warning_line_and_applies(
        replace_unk_patch_removed, monkeypatch, caplog):
    import fairseq
    from fairseq import utils

    original = utils.load_align_dict
    monkeypatch.setattr(fairseq, "__version__", "0.13.0")
    with caplog.at_level(logging.WARNING, logger="user_plugin.fairseq_patches"):
        done = fairseq_patches.install(only=lambda patch: patch.name == "replace_unk_flag")
    warnings = [r for r in caplog.records if r.name == "user_plugin.fairseq_patches"]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    message = warnings[0].getMessage()
    assert "fairseq 0.13.0" in message and "replace_unk_flag" in message
    assert "applying them anyway" in message
    assert done == ("replace_unk_flag",) and utils.load_align_dict is not original
    fairseq_patches.uninstall(("replace_unk_flag",))
    assert utils.load_align_dict is original


def test_an_unchecked_version_skips_a_patch_whose_target_is_gone(monkeypatch, caplog):
    import fairseq

    from user_plugin.fairseq_patches.precision import trainer_train_step_fp16_on_cpu

    gone = Patch("gone", (Replacement("fairseq.trainer:Trainer.no_such_method",
                                      trainer_train_step_fp16_on_cpu),),
                 "a row whose target a later fairseq removed", EVERY_RUN)
    monkeypatch.setattr(fairseq_patches, "PATCHES", (gone,))
    monkeypatch.setattr(fairseq_patches, "BY_NAME", {"gone": gone})
    monkeypatch.setattr(fairseq, "__version__", "1.0.0")
    with caplog.at_level(logging.WARNING, logger="user_plugin.fairseq_patches"):
        assert fairseq_patches.install() == ()
    (warning,) = [r for r in caplog.records if r.name == "user_plugin.fairseq_patches"]
    assert "skipped, target missing: gone" in warning.getMessage()
    assert "gone" not in fairseq_patches.installed()


def test_tensor_cuda_is_replaced_only_inside_the_with_block():
    import torch

    from user_plugin.fairseq_patches.precision import _tensor_cuda_stays_on_cpu

    cuda = torch.Tensor.cuda
    with pytest.raises(RuntimeError, match="inside"):
        with _tensor_cuda_stays_on_cpu():
            x = torch.zeros(2)
            assert torch.Tensor.cuda is not cuda and x.cuda() is x
            raise RuntimeError("inside")
    assert torch.Tensor.cuda is cuda


def test_the_excepthook_one_lines_only_the_errors_it_recognises(monkeypatch, capsys):
    from user_plugin.fairseq_patches.one_line_errors import one_line_excepthook
    from user_plugin.files.errors import UserError

    passed_on = []
    hook = one_line_excepthook(lambda kind, error, tb: passed_on.append(error))
    monkeypatch.setattr(sys, "argv", ["fairseq-train"])
    for error in (UserError("bad input"),
                  AssertionError("Sentences lengths should not exceed max_tokens=7")):
        hook(type(error), error, None)
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("fairseq-train: error: "), lines
    bugs = (AssertionError("an invariant of fairseq's"), ValueError("a bug"),
            KeyError("x"), RuntimeError("CUDA out of memory"))
    for error in bugs:
        hook(type(error), error, None)
    assert passed_on == list(bugs) and capsys.readouterr().err == ""
