"""Export to fairseq's built-in ``transformer`` (user_plugin/export/fairseq_checkpoint.py): stock
fairseq-generate, without --user-dir and under torch's safe loading, decodes the exported
checkpoint to our model's hypotheses and scores; what the built-in cannot express is refused
with one line and nothing written."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import forked_cli
import pytest
import torch
from cli import REFUSE_OUR_PLUGIN, REPO, USER_DIR, fairseq_env, hypotheses, run_fairseq
from conftest import (
    SHIPPING_VARIANTS,
    TINY,
    build_vaswani,
    fake_task,
    make_dictionary,
    our_checkpoint_with,
)

from user_plugin.artifacts.builtin_transformer import (
    OPTION_MAPPING,
    refusal,
    to_builtin_transformer,
)
from user_plugin.export.fairseq_checkpoint import stock_layout_problem
from user_plugin.models.transformer_config import VaswaniTransformerConfig
from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

#: fairseq-generate with nothing of ours importable: any import of ``user_plugin`` raises, and
#: none may be loaded at the end (torch's safe loading off, as stock fairseq needs it for the
#: ``argparse.Namespace`` of its own checkpoints).
STOCK_GENERATE = REFUSE_OUR_PLUGIN + """from fairseq_cli.generate import cli_main

sys.argv = ["fairseq-generate", *sys.argv[1:]]
cli_main()
ours = [name for name in sys.modules if name.split(".")[0] == "user_plugin"]
assert not ours, ours
"""

DECODING = ["--gen-subset", "test", "--beam", "4", "--lenpen", "0.6", "--max-len-a", "1",
            "--max-len-b", "50", "--batch-size", "16", "--required-batch-size-multiple", "1"]


def export(*args, cwd=None) -> subprocess.CompletedProcess:
    return forked_cli.run(
        [sys.executable, "-m", "user_plugin.export", *map(str, args)], cwd=cwd,
        env={**fairseq_env(), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=600, check=False,
    )


def stock_generate(data_bin, path, tmp_path) -> subprocess.CompletedProcess:
    # the export is laid out as stock fairseq's own checkpoints (cfg.model a Namespace), which
    # stock fairseq loads under torch >= 2.6 only with weights_only loading off, as its own
    env = {**fairseq_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    env.pop("PYTHONPATH", None)
    return forked_cli.run(
        [sys.executable, "-c", STOCK_GENERATE, str(data_bin), "--path", str(path), *DECODING],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


@pytest.fixture(scope="module")
def exported(shipping_models, tmp_path_factory):
    """Each shipping variant exported by the command line: variant -> path."""
    out = tmp_path_factory.mktemp("exported")
    paths = {}
    for variant, checkpoint in shipping_models.checkpoints.items():
        path = out / f"{variant}.pt"
        proc = export(checkpoint, "--data-dir", shipping_models.data_bin, "--to", "fairseq",
                      "--output", path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        paths[variant] = path
    return paths


def test_every_option_of_our_model_is_mapped():
    options = {f.name for f in dataclasses.fields(VaswaniTransformerConfig)} - {"_name"}
    assert options == set(OPTION_MAPPING)


@pytest.mark.parametrize("variant", sorted(SHIPPING_VARIANTS))
def test_stock_fairseq_generate_decodes_the_export_as_ours(variant, shipping_models, exported,
                                                          tmp_path):
    proc = stock_generate(shipping_models.data_bin, exported[variant], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = hypotheses(proc.stdout)
    ours = hypotheses(run_fairseq("generate", [
        shipping_models.data_bin, "--user-dir", USER_DIR, "--task", "translation",
        "--path", shipping_models.checkpoints[variant], *DECODING,
    ]).stdout)
    assert sorted(theirs) == sorted(ours) == list(range(100))
    lengths = [len(entry["tokens"]) for entry in ours.values()]
    assert max(lengths) >= 5, "the model should decode real sentences, not stubs"
    for sample_id, entry in ours.items():
        assert theirs[sample_id]["tokens"] == entry["tokens"], sample_id
        assert theirs[sample_id]["score"] == pytest.approx(entry["score"], abs=1e-4), sample_id


@pytest.mark.parametrize("variant", sorted(SHIPPING_VARIANTS))
def test_export_holds_stock_components_laid_out_as_stock_fairseq_writes_them(variant, exported):
    """cfg.model is the legacy transformer's argparse.Namespace (what CTranslate2's converter
    reads attributes of), with the task's options as fairseq's holds them; all else plain."""
    import argparse

    state = torch.load(exported[variant], map_location="cpu", weights_only=True)
    assert stock_layout_problem(state) is None
    cfg = state["cfg"]
    assert type(cfg["model"]) is argparse.Namespace
    model = vars(cfg["model"])
    assert model["_name"] == model["arch"] == "transformer" and model["task"] == "translation"
    assert model["encoder_learned_pos"] and model["decoder_learned_pos"]
    assert cfg["task"]["_name"] == "translation"
    assert cfg["criterion"]["_name"] == "label_smoothed_cross_entropy"
    assert cfg["common"]["user_dir"] is None
    assert "vaswani" not in repr(cfg)
    assert "last_optimizer_state" not in state


def test_sinusoids_become_the_learned_table_from_fairseq_padding_offset(shipping_models,
                                                                         exported):
    from user_plugin.modules.positional_encoding import sinusoidal_table

    state = torch.load(exported["postnorm_shared"], map_location="cpu", weights_only=True)
    table = state["model"]["encoder.embed_positions.weight"]
    pad = 1  # fairseq's dictionaries: <s> 0, <pad> 1
    dim = state["cfg"]["model"].encoder_embed_dim
    positions = state["cfg"]["model"].max_source_positions
    assert table.shape == (positions + pad + 1, dim)
    assert torch.equal(table[: pad + 1], torch.zeros(pad + 1, dim))
    assert torch.equal(table[pad + 1:], sinusoidal_table(positions, dim))


def test_row_b_model_is_refused_with_one_line(shipping_models, tmp_path):
    checkpoint = tmp_path / "row_b.pt"
    our_checkpoint_with(shipping_models.checkpoints["postnorm_shared"], checkpoint,
                        attention_key_dim=4)
    output = tmp_path / "out.pt"
    proc = export(checkpoint, "--data-dir", shipping_models.data_bin, "--to", "fairseq",
                  "--output", output)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("vaswani-export: error: ")
    assert "d_k = 4" in lines[-1] and "Table 3 row B" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not output.exists() and list(tmp_path.iterdir()) == [checkpoint]


def test_extension_checkpoint_is_refused_with_one_line(shipping_models, tmp_path):
    checkpoint = tmp_path / "gated.pt"
    our_checkpoint_with(shipping_models.checkpoints["postnorm_shared"], checkpoint,
                        _name="gated_ffn_base")
    output = tmp_path / "out.pt"
    proc = export(checkpoint, "--data-dir", shipping_models.data_bin, "--to", "fairseq",
                  "--output", output)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "gated_ffn_base" in proc.stderr and "extension" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not output.exists()


def test_extension_model_class_is_refused():
    class ExtendedTransformer(VaswaniTransformerModel):
        @classmethod
        def build_feed_forward(cls, stack):
            return torch.nn.Sequential(torch.nn.Linear(stack.embed_dim, stack.embed_dim))

    dictionary = make_dictionary(40)
    ours = build_vaswani(dictionary, **TINY)
    assert refusal(ours) is None
    extended = ExtendedTransformer.build_model(ours.cfg, fake_task(dictionary))
    assert "ExtendedTransformer" in refusal(extended)
    with pytest.raises(Exception, match="cannot express"):
        to_builtin_transformer(extended, fake_task(dictionary))


def test_d_k_equal_to_d_model_over_heads_is_not_row_b():
    dictionary = make_dictionary(40)
    same = build_vaswani(dictionary, **TINY, attention_key_dim=8, attention_value_dim=8)
    assert refusal(same) is None
    row_b = build_vaswani(dictionary, **TINY, attention_key_dim=4, attention_value_dim=8)
    assert "d_k = 4" in refusal(row_b)


@pytest.mark.parametrize("problem", ["missing", "truncated", "no data dir"])
def test_bad_input_is_one_line_and_writes_nothing(problem, shipping_models, tmp_path):
    checkpoint = shipping_models.checkpoints["postnorm_shared"]
    data_bin = shipping_models.data_bin
    if problem == "missing":
        checkpoint = tmp_path / "nothing.pt"
    elif problem == "truncated":
        content = checkpoint.read_bytes()
        checkpoint = tmp_path / "cut.pt"
        checkpoint.write_bytes(content[: len(content) // 2])
    else:
        data_bin = tmp_path / "no-such-dir"
    output = tmp_path / "out" / "model.pt"
    proc = export(checkpoint, "--data-dir", data_bin, "--to", "fairseq", "--output", output)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(checkpoint if problem != "no data dir" else data_bin) in errors[0]
    assert not output.exists()


def test_rerun_replaces_the_file_atomically(shipping_models, exported, tmp_path):
    output = tmp_path / "model.pt"
    output.write_bytes(b"an older export")
    proc = export(shipping_models.checkpoints["postnorm_shared"], "--data-dir",
                  shipping_models.data_bin, "--to", "fairseq", "--output", output)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.listdir(tmp_path) == ["model.pt"]
    again = torch.load(output, map_location="cpu", weights_only=True)["model"]
    first = torch.load(exported["postnorm_shared"], map_location="cpu", weights_only=True)
    assert again.keys() == first["model"].keys()
    assert all(torch.equal(again[name], first["model"][name]) for name in again)


@pytest.mark.parametrize("options", [
    {"layernorm_embedding": True},
    {"no_token_positional_embeddings": True},
    {"decoder_output_dim": 24, "share_all_embeddings": False},
    {"cross_self_attention": True},
    {"no_cross_attention": True},
    {"encoder_layers_to_keep": "1", "decoder_layerdrop": 0.2},
    {"encoder_normalize_before": True, "decoder_normalize_before": True,
     "no_decoder_final_norm": True},
], ids=lambda options: ",".join(options))
def test_options_beyond_the_paper_export_to_the_same_function(options, shipping_models,
                                                              tmp_path):
    """The export verifies itself (fairseq's loader builds it from the file; its
    log-probabilities must equal ours): passing means the options map."""
    from user_plugin.export.fairseq_checkpoint import export_fairseq_checkpoint

    checkpoint = tmp_path / "variant.pt"
    our_checkpoint_with(shipping_models.checkpoints["postnorm_shared"], checkpoint, **options)
    output = export_fairseq_checkpoint(checkpoint, shipping_models.data_bin,
                                       tmp_path / "out.pt")
    model = vars(torch.load(output, map_location="cpu", weights_only=True)["cfg"]["model"])
    for name, value in options.items():
        if name.endswith("layers_to_keep"):
            assert model[name] is None and model["encoder_layers"] == 1
        else:
            assert model[name] == value, name
