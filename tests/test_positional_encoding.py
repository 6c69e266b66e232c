"""Positional encoding (§3.5): the interleaved sin/cos formula; positions that ignore padding."""

import math

import torch
from conftest import TINY, build_vaswani, make_dictionary

from user_plugin.modules.positional_encoding import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
    token_positions,
)


def test_table_equals_the_papers_formula_elementwise():
    d_model = 10
    table = sinusoidal_table(60, d_model)
    for pos in (0, 1, 7, 59):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_odd_width_keeps_the_formula_for_the_last_sine_channel():
    table = sinusoidal_table(5, 7)
    assert table.shape == (5, 7)
    assert math.isclose(table[3, 6].item(), math.sin(3 / 10000 ** (6 / 7)), abs_tol=1e-6)


def test_positions_count_real_tokens_from_zero_whatever_the_padding():
    pad = 1
    left = torch.tensor([[1, 1, 5, 6, 7], [5, 6, 7, 8, 9]])
    right = torch.tensor([[5, 6, 7, 1, 1]])
    assert token_positions(left, pad).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert token_positions(right, pad).tolist() == [[0, 1, 2, 0, 0]]


def test_learned_and_fixed_modules_share_one_interface():
    positions = torch.tensor([[0, 1, 2]])
    fixed = SinusoidalPositionalEncoding(8, 16)
    learned = LearnedPositionalEmbedding(8, 16)
    assert fixed(positions).shape == learned(positions).shape == (1, 3, 8)
    assert not list(fixed.parameters()) and "table" not in fixed.state_dict()
    assert learned.weight.requires_grad


def test_encoder_adds_scaled_embeddings_and_the_encoding():
    dictionary = make_dictionary(20)
    model = build_vaswani(dictionary, "vaswani_base", **TINY).eval()
    tokens = torch.tensor([[5, 6, 7, dictionary.eos()]])
    captured = {}
    model.encoder.layers[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    model.encoder(tokens)
    expected = math.sqrt(32) * model.encoder.embed_tokens(tokens) + sinusoidal_table(4, 32)
    torch.testing.assert_close(captured["x"], expected)
