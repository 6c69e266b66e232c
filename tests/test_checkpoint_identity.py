"""Identity decided by content and covering the architecture: a copy of a checkpoint is used
once wherever checkpoints are combined (the averager, fairseq-generate's ``--path a:b``
ensembles, the hub's ensembles), and the training fingerprint covers every model option that
changes what the same parameters compute (heads, activation, embedding scale...), checked on
resume, averaging and ensembles (``user_plugin.artifacts.fingerprint``).

The matrix of cases, outcomes and tests is docs/faults.md ("Identity that covers the
architecture"). Files that a refused command must leave alone are compared by sha256 before
and after (``fault_injection.snapshot``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY, our_checkpoint_with
from fault_injection import snapshot
from test_fault_classes import (
    average,
    error_line,
    one_error_line,
    run_cli,
    tiny_checkpoint,
    train_into,
)

from user_plugin.artifacts.fingerprint import (
    ARCHITECTURE,
    ARCHITECTURE_OPTIONS,
    NOT_ARCHITECTURE_OPTIONS,
    architecture,
    stored_fingerprint,
    unchecked_note,
)


def with_options(**options) -> dict:
    """A checkpoint configuration of the tiny model with ``options`` changed."""
    return {"model": {"_name": "vaswani_base", **TINY, **options}}


# --------------------------------------------------------------------------------------------
# A copy counts once


def test_averaging_a_byte_copy_uses_it_once(tmp_path, capsys):
    """``checkpoint_last.pt`` beside the interval checkpoint it is a byte copy of (before:
    (w4 + 2·w5) / 3); the mean is (w4 + w5) / 2, and one note line names the copy."""
    c4 = tiny_checkpoint(tmp_path / "checkpoint4.pt", seed=4)
    c5 = tiny_checkpoint(tmp_path / "checkpoint5.pt", seed=5)
    last = tmp_path / "checkpoint_last.pt"
    shutil.copyfile(c5, last)
    status, err = average(["--inputs", c4, c5, last, "--output", tmp_path / "avg.pt"], capsys)
    notes = [line for line in err.splitlines() if "holds the same parameters" in line]
    assert status == 0 and len(notes) == 1 and notes[0].startswith("note: ")
    assert f"{last} holds the same parameters as {c5}" in notes[0]
    status, _ = average(["--inputs", c4, c5, "--output", tmp_path / "avg45.pt"], capsys)
    averaged = torch.load(tmp_path / "avg.pt", weights_only=True)
    expected = torch.load(tmp_path / "avg45.pt", weights_only=True)
    assert status == 0 and averaged["averaged_from"] == ["checkpoint4.pt", "checkpoint5.pt"]
    for key, tensor in expected["model"].items():
        assert torch.equal(averaged["model"][key], tensor), key
    w4 = torch.load(c4, weights_only=True)["model"]["encoder.embed_tokens.weight"]
    w5 = torch.load(c5, weights_only=True)["model"]["encoder.embed_tokens.weight"]
    assert torch.allclose(averaged["model"]["encoder.embed_tokens.weight"], (w4 + w5) / 2)


def generate_lines(data_bin: Path, paths: str) -> tuple[list[str], str]:
    proc = run_cli("generate", [data_bin, "--user-dir", "user_plugin", "--path", paths, "--cpu",
                                "--gen-subset", "test", "--beam", "2", "--max-tokens", "4000",
                                "--required-batch-size-multiple", "1",
                                "--skip-invalid-size-inputs-valid-test"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted(line for line in proc.stdout.splitlines() if line[:2] in ("H-", "P-")), \
        proc.stderr


def test_ensembles_use_a_copy_once(trained_multi30k, tmp_path, caplog):
    """``fairseq-generate --path a:b:copy-of-b`` decodes as ``--path a:b`` (before: b weighed
    twice), and so does the hub's ensemble."""
    from user_plugin import hub

    a = trained_multi30k.checkpoint_dir / "checkpoint_1_20.pt"
    b = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    copy = tmp_path / "copy.pt"
    shutil.copyfile(b, copy)
    three, err = generate_lines(trained_multi30k.data_bin, f"{a}:{b}:{copy}")
    two, _ = generate_lines(trained_multi30k.data_bin, f"{a}:{b}")
    assert three == two and len(two) > 100
    notes = [line for line in err.splitlines() if "holds the same parameters" in line]
    assert len(notes) == 1 and f"{copy} holds the same parameters as {b}" in notes[0]
    with caplog.at_level(logging.WARNING):
        translator = hub.load_translator(trained_multi30k.data_bin, checkpoints=[a, b, copy],
                                         source_lang="en", target_lang="de")
    assert len(translator.models) == 2
    assert f"{copy} holds the same parameters as {b}" in caplog.text


# --------------------------------------------------------------------------------------------
# The architecture part of the fingerprint


def test_every_model_option_is_classified():
    """Each option of the model is part of the architecture (with its default) or known not to
    change what the parameters compute: a new option must be placed in one of the two."""
    from user_plugin.models.transformer_config import VaswaniTransformerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(VaswaniTransformerConfig)
                if not f.name.startswith("_")}
    assert set(ARCHITECTURE_OPTIONS) | NOT_ARCHITECTURE_OPTIONS == set(defaults)
    assert not set(ARCHITECTURE_OPTIONS) & NOT_ARCHITECTURE_OPTIONS
    for name, default in ARCHITECTURE_OPTIONS.items():
        assert default == getattr(defaults[name], "value", defaults[name]), name


def test_the_architecture_is_read_from_any_model_configuration():
    from omegaconf import OmegaConf

    plain = {"_name": "vaswani_base", "encoder_attention_heads": 4,
             "adaptive_softmax_cutoff": [10, 20], "dropout": 0.3}
    for config in (plain, OmegaConf.create(plain), argparse.Namespace(**plain)):
        found = architecture(config)
        assert found["encoder_attention_heads"] == 4 and found["decoder_attention_heads"] == 8
        assert found["adaptive_softmax_cutoff"] == "10,20" and "dropout" not in found
    assert architecture({"adaptive_softmax_cutoff": "10,20", "encoder_attention_heads": 4}) == \
        architecture(plain)
    old = {"model": {}, "args": argparse.Namespace(**plain)}  # the oldest layout: args only
    assert stored_fingerprint(old)[ARCHITECTURE]["encoder_attention_heads"] == 4
    bare = {"model": {}, "cfg": None}
    assert stored_fingerprint(bare) is None
    note = unchecked_note([("bare.pt", None)])
    assert note.count("note:") == 1 and "its architecture options cannot be checked" in note
    assert "its dictionaries and language direction cannot be checked" in note


@pytest.mark.parametrize("option, value, words", [
    ("encoder_attention_heads", 8, "--encoder-attention-heads 8"),
    ("activation_fn", "gelu", "--activation-fn gelu"),
    ("no_scale_embedding", True, "--no-scale-embedding"),
    ("cross_self_attention", True, "--cross-self-attention"),
])
def test_averaging_refuses_other_architecture_options_of_the_same_shapes(option, value, words,
                                                                         tmp_path, capsys):
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1)
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2, cfg=with_options(**{option: value}))
    before = snapshot(tmp_path)
    status, err = average(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    line = one_error_line(err)
    ours = ARCHITECTURE_OPTIONS[option] if option not in TINY else TINY[option]
    assert status == 1 and f"cannot average: {b} was trained with {words} but {a} with" in line
    assert (f"--{option.replace('_', '-')} {ours}" if not isinstance(value, bool)
            else f"no --{option.replace('_', '-')}") in line
    assert snapshot(tmp_path) == before


def test_an_extensions_own_options_count_when_both_checkpoints_hold_them(tmp_path, capsys):
    """An extension's model option (a dataclass field of its own) is part of the architecture;
    a checkpoint written before the option existed is compared on the others."""
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1, cfg=with_options(ffn_gate_activation="gelu"))
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2, cfg=with_options(ffn_gate_activation="silu"))
    older = tiny_checkpoint(tmp_path / "older.pt", seed=3)
    status, err = average(["--inputs", a, b, "--output", tmp_path / "ab.pt"], capsys)
    assert status == 1 and (f"{b} was trained with --ffn-gate-activation silu but {a} with "
                            "--ffn-gate-activation gelu") in one_error_line(err)
    status, err = average(["--inputs", a, older, "--output", tmp_path / "a-older.pt"], capsys)
    assert status == 0 and "trained with" not in err


def test_averaging_accepts_checkpoints_that_differ_in_training_only_options(tmp_path, capsys):
    a = tiny_checkpoint(tmp_path / "a.pt", seed=1)
    b = tiny_checkpoint(tmp_path / "b.pt", seed=2, cfg=with_options(dropout=0.3,
                                                                     encoder_layerdrop=0.1))
    status, err = average(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    assert status == 0 and "architecture" not in err and "trained with" not in err


def test_resuming_with_other_heads_is_refused_naming_the_option_and_both_values(
        trained_multi30k, tmp_path):
    """A save dir trained with 4 heads resumed with 8 (the same shapes; before: resumed
    without a word, and the weights computed another function)."""
    save_dir = tmp_path / "checkpoints"
    shutil.copytree(trained_multi30k.checkpoint_dir, save_dir,
                    ignore=shutil.ignore_patterns("*.lock"))
    before = snapshot(save_dir)
    proc = run_cli("train", train_into(trained_multi30k, save_dir,
                                       "--encoder-attention-heads", "8",
                                       "--decoder-attention-heads", "8"))
    line = error_line(proc.stderr)
    assert proc.returncode == 1
    assert (f"cannot resume: {save_dir / 'checkpoint_last.pt'} was trained with "
            "--encoder-attention-heads 4, --decoder-attention-heads 4 but this run with "
            "--encoder-attention-heads 8, --decoder-attention-heads 8") in line
    assert {k: v for k, v in snapshot(save_dir).items() if "lock" not in k} == \
        {k: v for k, v in before.items() if "lock" not in k}


def test_ensembles_refuse_checkpoints_of_other_architecture_options(trained_multi30k,
                                                                     tmp_path):
    """fairseq-generate's ``--path a:b`` and the hub's ensembles, one checkpoint with 8 heads
    where the other has 4 (the same shapes)."""
    from user_plugin import hub

    last = trained_multi30k.checkpoint_dir / "checkpoint_last.pt"
    other = tmp_path / "eight_heads.pt"
    our_checkpoint_with(last, other, encoder_attention_heads=8, decoder_attention_heads=8)
    proc = run_cli("generate", [trained_multi30k.data_bin, "--user-dir", "user_plugin",
                                "--path", f"{last}:{other}", "--cpu", "--max-tokens", "2000"])
    line = error_line(proc.stderr)
    assert proc.returncode != 0 and "these checkpoints cannot be used together" in line
    assert f"{other} was trained with --encoder-attention-heads 8" in line
    with pytest.raises(hub.ArtifactError, match="--encoder-attention-heads 8"):
        hub.load_translator(trained_multi30k.data_bin, checkpoints=[last, other],
                            source_lang="en", target_lang="de")
