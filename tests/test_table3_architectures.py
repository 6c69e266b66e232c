"""Every row of the paper's Table 3 as a registered architecture: what each changes from the
base model, the parameter counts of the table's params column, and the label-smoothing rows."""

import argparse
import logging
from collections import Counter

import pytest
import torch
from conftest import build_vaswani, make_dictionary, model_args
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from user_plugin.models.table3_architectures import TABLE3, label_smoothing_for
from user_plugin.models.vaswani_transformer import VaswaniTransformerModel
from user_plugin.modules.positional_encoding import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
)

SIDES = ("encoder", "decoder")


def both(name, value):
    return {f"{side}_{name}": value for side in SIDES}


#: What each architecture changes from vaswani_table3_base (the model options only).
EXPECTED_CHANGES = {
    "vaswani_table3_base": {},
    "vaswani_table3_a_heads1_dk512": both("attention_heads", 1),
    "vaswani_table3_a_heads4_dk128": both("attention_heads", 4),
    "vaswani_table3_a_heads16_dk32": both("attention_heads", 16),
    "vaswani_table3_a_heads32_dk16": both("attention_heads", 32),
    "vaswani_table3_b_dk16": {"attention_key_dim": 16},
    "vaswani_table3_b_dk32": {"attention_key_dim": 32},
    "vaswani_table3_c_layers2": both("layers", 2),
    "vaswani_table3_c_layers4": both("layers", 4),
    "vaswani_table3_c_layers8": both("layers", 8),
    "vaswani_table3_c_dmodel256": both("embed_dim", 256),
    "vaswani_table3_c_dmodel1024": both("embed_dim", 1024),
    "vaswani_table3_c_dff1024": both("ffn_embed_dim", 1024),
    "vaswani_table3_c_dff4096": both("ffn_embed_dim", 4096),
    "vaswani_table3_d_dropout0_0": {"dropout": 0.0},
    "vaswani_table3_d_dropout0_2": {"dropout": 0.2},
    "vaswani_table3_d_ls0_0": {},
    "vaswani_table3_d_ls0_2": {},
    "vaswani_table3_e_learned_pos": both("learned_pos", True),
    "vaswani_table3_big": {**both("embed_dim", 1024), **both("ffn_embed_dim", 4096),
                           **both("attention_heads", 16), "dropout": 0.3},
}

#: Rows whose count is further than 3M from the table's with a 37,000-type vocabulary. d_model
#: 1024 doubles the embedding's share of the model; Table 3's counts fit a vocabulary of about
#: 41k types for every row but big (base 65M: 44.1M + 512 V), which puts this row 4.1M low.
PARAMS_TOLERANCE_MILLIONS = {"vaswani_table3_c_dmodel1024": 4.5}


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build_on_meta(arch: str, vocab: int = 37000, **overrides):
    """The model without allocating its weights (parameter counts and shapes only)."""
    with torch.device("meta"):
        return build_vaswani(make_dictionary(vocab), arch, share_all_embeddings=True, **overrides)


def test_every_row_of_table3_is_registered_in_order():
    assert list(TABLE3) == list(EXPECTED_CHANGES)
    rows = Counter(row.row for row in TABLE3.values())
    assert rows == {"base": 1, "A": 4, "B": 2, "C": 7, "D": 4, "E": 1, "big": 1}
    for arch in TABLE3:
        assert ARCH_MODEL_REGISTRY[arch] is VaswaniTransformerModel, arch


@pytest.mark.parametrize("arch", list(EXPECTED_CHANGES))
def test_each_row_changes_only_its_own_options(arch):
    base = vars(model_args("vaswani_table3_base"))
    variant = vars(model_args(arch))
    changed = {k: v for k, v in variant.items() if base.get(k) != v}
    assert changed == EXPECTED_CHANGES[arch]


def test_table3_base_and_big_are_the_papers_base_and_big():
    assert vars(model_args("vaswani_table3_base")) == vars(model_args("vaswani_base"))
    assert vars(model_args("vaswani_table3_big")) == vars(model_args("vaswani_big"))


@pytest.mark.parametrize(
    "arch", [arch for arch, row in TABLE3.items() if row.paper_params_millions is not None]
)
def test_parameter_counts_match_table3(arch):
    millions = count(build_on_meta(arch)) / 1e6
    expected = TABLE3[arch].paper_params_millions
    assert abs(millions - expected) <= PARAMS_TOLERANCE_MILLIONS.get(arch, 3.0), millions


@pytest.mark.parametrize("arch, heads, head_dim", [
    ("vaswani_table3_a_heads1_dk512", 1, 512),
    ("vaswani_table3_a_heads4_dk128", 4, 128),
    ("vaswani_table3_a_heads16_dk32", 16, 32),
    ("vaswani_table3_a_heads32_dk16", 32, 16),
])
def test_row_a_keeps_the_computation_constant(arch, heads, head_dim):
    model = build_on_meta(arch, vocab=100)
    for attn in (model.encoder.layers[0].self_attn, model.decoder.layers[0].encoder_attn):
        assert (attn.num_heads, attn.key_dim, attn.value_dim) == (heads, head_dim, head_dim)
        assert attn.q_proj.weight.shape == (512, 512) and attn.v_proj.weight.shape == (512, 512)


@pytest.mark.parametrize("arch, key_dim", [("vaswani_table3_b_dk16", 16),
                                           ("vaswani_table3_b_dk32", 32)])
def test_row_b_shrinks_queries_and_keys_only(arch, key_dim):
    model = build_on_meta(arch, vocab=100)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        attns = [layer.self_attn] + ([layer.encoder_attn] if hasattr(layer, "encoder_attn") else [])
        for attn in attns:
            assert attn.q_proj.weight.shape == (8 * key_dim, 512)
            assert attn.k_proj.weight.shape == (8 * key_dim, 512)
            assert attn.v_proj.weight.shape == (8 * 64, 512)
            assert attn.out_proj.weight.shape == (512, 8 * 64)


def test_row_b_attends_with_the_smaller_keys():
    """A tiny d_k-16 model runs forward, so Q K^T uses 16-wide keys with 64-wide values."""
    from conftest import random_batch

    dictionary = make_dictionary(50)
    model = build_vaswani(dictionary, "vaswani_table3_b_dk16", encoder_layers=1, decoder_layers=1,
                          share_all_embeddings=True, dropout=0.0)
    src, src_lengths, prev = random_batch(dictionary)
    logits, _ = model(src, src_lengths, prev)
    assert logits.shape == (*prev.shape, len(dictionary))
    assert torch.isfinite(logits).all()


def test_row_e_learns_the_positions_in_both_stacks():
    base = build_on_meta("vaswani_table3_base", vocab=100)
    learned = build_on_meta("vaswani_table3_e_learned_pos", vocab=100)
    assert isinstance(base.encoder.embed_positions, SinusoidalPositionalEncoding)
    for stack in (learned.encoder, learned.decoder):
        assert isinstance(stack.embed_positions, LearnedPositionalEmbedding)
    assert count(learned) - count(base) == 2 * 1024 * 512


def test_command_line_options_win_over_the_row():
    args = model_args("vaswani_table3_c_layers2", encoder_layers=3, encoder_embed_dim=64)
    assert (args.encoder_layers, args.decoder_layers) == (3, 2)
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (64, 512)


@pytest.mark.parametrize("arch, smoothing", [("vaswani_table3_base", 0.1),
                                             ("vaswani_table3_d_ls0_0", 0.0),
                                             ("vaswani_table3_d_ls0_2", 0.2),
                                             ("vaswani_table3_d_dropout0_2", 0.1)])
def test_label_smoothing_rows_record_their_criterion_setting(arch, smoothing):
    assert label_smoothing_for(arch) == smoothing


def test_label_smoothing_of_an_unknown_arch_names_it():
    with pytest.raises(KeyError, match="vaswani_base.*not a Table 3 architecture"):
        label_smoothing_for("vaswani_base")


def test_training_with_another_label_smoothing_than_the_row_warns(caplog):
    """fairseq-train hands the arch every option, the criterion's --label-smoothing included."""
    arch_fn = ARCH_CONFIG_REGISTRY["vaswani_table3_d_ls0_2"]
    with caplog.at_level(logging.WARNING):
        arch_fn(argparse.Namespace(label_smoothing=0.2))
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        arch_fn(argparse.Namespace(label_smoothing=0.1))
    assert any("--label-smoothing 0.2" in r.getMessage() for r in caplog.records)
