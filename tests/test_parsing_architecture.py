"""The parsing model of §6.3 (``vaswani_parsing_wsj``): 4 layers, d_model 1024, otherwise the
base model; the tuned options (dropout, learning rate) stay the user's; its parameter count with
the paper's 16K source vocabulary and a bracket vocabulary on the target side."""

from __future__ import annotations

from conftest import fake_task, make_dictionary, model_args
from fairseq.models import ARCH_MODEL_REGISTRY

from user_plugin.models.transformer_config import VaswaniTransformerConfig
from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

ARCH = "vaswani_parsing_wsj"
SIDES = ("encoder", "decoder")


def test_parsing_architecture_is_the_base_model_with_4_layers_of_1024():
    assert ARCH_MODEL_REGISTRY[ARCH] is VaswaniTransformerModel
    parsing, base = vars(model_args(ARCH)), vars(model_args("vaswani_base"))
    changed = {key for key in parsing if parsing[key] != base.get(key)}
    assert changed == {f"{side}_{name}" for side in SIDES for name in ("layers", "embed_dim")}
    for side in SIDES:
        assert parsing[f"{side}_layers"] == 4 and parsing[f"{side}_embed_dim"] == 1024
        assert parsing[f"{side}_ffn_embed_dim"] == 2048
        assert parsing[f"{side}_attention_heads"] == 8
    assert parsing["dropout"] == 0.1


def test_options_given_by_the_user_win():
    args = model_args(ARCH, dropout=0.3, encoder_layers=2, decoder_embed_dim=512)
    assert (args.dropout, args.encoder_layers, args.decoder_layers) == (0.3, 2, 4)
    assert (args.encoder_embed_dim, args.decoder_embed_dim) == (1024, 512)


def expected_parameters(layers: int, d: int, ff: int, src_vocab: int, tgt_vocab: int) -> int:
    """Post-norm layers (§3.1): attention = 4 projections with biases, the feed-forward's two
    linears, a LayerNorm per sub-layer; source and target embeddings, the decoder's tied with
    the pre-softmax linear; sinusoidal positions have no parameters."""
    attention = 4 * (d * d + d)
    feed_forward = d * ff + ff + ff * d + d
    norm = 2 * d
    encoder = layers * (attention + feed_forward + 2 * norm)
    decoder = layers * (2 * attention + feed_forward + 3 * norm)
    return encoder + decoder + src_vocab * d + tgt_vocab * d


def test_parameter_count_with_a_16k_word_and_a_bracket_vocabulary():
    words, brackets = make_dictionary(16000), make_dictionary(60)
    cfg = VaswaniTransformerConfig.from_namespace(
        model_args(ARCH, share_decoder_input_output_embed=True))
    model = VaswaniTransformerModel.build_model(cfg, fake_task(words, brackets))
    count = sum(p.numel() for p in model.parameters())
    assert count == expected_parameters(4, 1024, 2048, 16000, 60)
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight
    assert model.encoder.embed_tokens.weight is not model.decoder.embed_tokens.weight
