"""Parameter counts of the paper's models (Table 3): base 65M, big 213M, with a shared
37,000-type vocabulary (§5.1) and all embeddings shared (§3.4)."""

import pytest
from conftest import build_vaswani, make_dictionary


def count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch, expected_millions", [("vaswani_base", 65), ("vaswani_big", 213)])
def test_paper_parameter_counts(arch, expected_millions):
    model = build_vaswani(make_dictionary(37000), arch, share_all_embeddings=True)
    assert abs(count(model) / 1e6 - expected_millions) <= 3.0, count(model)


def test_sharing_all_embeddings_saves_two_matrices():
    dictionary = make_dictionary(1000)
    shared = build_vaswani(dictionary, "vaswani_base", share_all_embeddings=True)
    separate = build_vaswani(dictionary, "vaswani_base")
    assert count(separate) - count(shared) == 2 * 1000 * 512
    assert shared.decoder.output_projection.weight is shared.encoder.embed_tokens.weight


def test_big_en_fr_differs_from_big_only_in_dropout():
    from conftest import model_args

    big, en_fr = model_args("vaswani_big"), model_args("vaswani_big_en_fr")
    assert (big.dropout, en_fr.dropout) == (0.3, 0.1)
    assert {k: v for k, v in vars(big).items() if k != "dropout"} == {
        k: v for k, v in vars(en_fr).items() if k != "dropout"
    }
    assert model_args("vaswani_base").dropout == 0.1


def test_initialisation_scales_follow_fairseq():
    """Queries, keys and values start at Xavier-uniform scale / sqrt(2), the output projection
    at Xavier scale with a zero bias, the feed-forward layers at PyTorch's +-1/sqrt(fan_in)."""
    import math

    import torch

    from user_plugin.modules.attention import MultiHeadAttention
    from user_plugin.modules.feed_forward import PositionWiseFeedForward

    torch.manual_seed(0)
    dim = 256
    attention = MultiHeadAttention(dim, 4)
    xavier = math.sqrt(6 / (dim + dim))
    for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
        bound = proj.weight.abs().max().item()
        assert xavier / math.sqrt(2) * 0.95 < bound <= xavier / math.sqrt(2)
        assert proj.bias.abs().max().item() > 0
    assert xavier * 0.95 < attention.out_proj.weight.abs().max().item() <= xavier
    assert attention.out_proj.bias.abs().max().item() == 0
    cross = MultiHeadAttention(dim, 4, kv_dim=128, encoder_decoder=True)
    assert cross.k_proj.weight.abs().max().item() > math.sqrt(6 / (dim + 128)) / math.sqrt(2)
    ffn = PositionWiseFeedForward(dim, 1024)
    for layer, fan_in in ((ffn.fc1, dim), (ffn.fc2, 1024)):
        bound = 1 / math.sqrt(fan_in)
        assert bound * 0.95 < layer.weight.abs().max().item() <= bound
        assert 0 < layer.bias.abs().max().item() <= bound
