"""The plugin's patches of fairseq (user_plugin/fairseq_patches): every attribute the plugin
replaces is a row of the one table, the off switch gives fairseq's own objects back (identity),
and a fairseq version outside the checked ones gives one warning line."""

import json
import logging
import subprocess
import sys

import pytest
from cli import REPO, fairseq_env

from user_plugin import fairseq_patches
from user_plugin.fairseq_patches import ENV_VAR, PATCHES, Patch, PatchSwitchError, Replacement

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
import user_plugin.registration  # VASWANI_FAIRSEQ_PATCHES=off: registers, patches nothing
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
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env,
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
import fairseq.checkpoint_utils as cu, fairseq.logging.progress_bar as pb, sys
from fairseq.trainer import Trainer
originals = {"progress_bar": pb.progress_bar, "train_step": Trainer.train_step,
             "init": Trainer.__init__, "load": cu.load_checkpoint, "hook": sys.excepthook}
import user_plugin.registration
from user_plugin import fairseq_patches
now = {"progress_bar": pb.progress_bar, "train_step": Trainer.train_step,
       "init": Trainer.__init__, "load": cu.load_checkpoint, "hook": sys.excepthook}
print(json.dumps({"same": sorted(k for k in originals if originals[k] is now[k]),
                  "installed": list(fairseq_patches.installed())}))
""".replace("import fairseq", "import json\nimport fairseq", 1)


def test_switch_off_by_name_keeps_fairseqs_own_functions_for_those_only():
    proc = run_python(IDENTITY_BY_NAME, "off:progress_report,mixed_precision")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["same"] == ["init", "progress_bar"]
    assert "progress_report" not in report["installed"]
    assert "mixed_precision" not in report["installed"]
    assert len(report["installed"]) == len(PATCHES) - 2


def test_a_misspelt_switch_is_one_error_line_naming_the_known_patches():
    proc = run_python("import user_plugin.registration", "off:progress_reprot")
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
        assert f"replaces {target}" in proc.stdout


def test_every_row_says_what_it_fixes_and_where_it_was_checked():
    assert len({patch.name for patch in PATCHES}) == len(PATCHES)
    for patch in PATCHES:
        assert patch.replaces and len(patch.fixes) > 40 and patch.checked, patch.name


@pytest.fixture
def progress_patch_removed():
    """The progress patch taken out of this (test) process, put back afterwards."""
    fairseq_patches.uninstall(("progress_report",))
    yield
    fairseq_patches.uninstall(("progress_report",))
    fairseq_patches.install(only=lambda patch: patch.name == "progress_report")


def test_an_unchecked_fairseq_version_gives_one_warning_line_and_applies(
        progress_patch_removed, monkeypatch, caplog):
    import fairseq
    from fairseq.logging import progress_bar

    original = progress_bar.progress_bar
    monkeypatch.setattr(fairseq, "__version__", "0.13.0")
    with caplog.at_level(logging.WARNING, logger="user_plugin.fairseq_patches"):
        done = fairseq_patches.install(only=lambda patch: patch.name == "progress_report")
    warnings = [r for r in caplog.records if r.name == "user_plugin.fairseq_patches"]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    message = warnings[0].getMessage()
    assert "fairseq 0.13.0" in message and "progress_report" in message
    assert "applying them anyway" in message
    assert done == ("progress_report",) and progress_bar.progress_bar is not original
    fairseq_patches.uninstall(("progress_report",))
    assert progress_bar.progress_bar is original


def test_an_unchecked_version_skips_a_patch_whose_target_is_gone(monkeypatch, caplog):
    import fairseq

    from user_plugin.fairseq_patches.precision import trainer_train_step_fp16_on_cpu

    gone = Patch("gone", (Replacement("fairseq.trainer:Trainer.no_such_method",
                                      trainer_train_step_fp16_on_cpu),),
                 "a row whose target a later fairseq removed")
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
