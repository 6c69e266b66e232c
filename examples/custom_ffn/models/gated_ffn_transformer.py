"""Model ``gated_ffn_transformer``: vaswani's Transformer with a gated feed-forward block.

Only the feed-forward sub-layer changes (§3.3); attention, residual wrapping, embeddings and
decoding are vaswani's. The change goes through the factory methods of vaswani's classes:

* ``EncoderLayer.build_feed_forward`` / ``DecoderLayer.build_feed_forward``: the block;
* ``VaswaniEncoder.build_layer`` / ``VaswaniDecoder.build_layer``: the layers;
* ``VaswaniTransformerModel.build_encoder`` / ``build_decoder``: the stacks.

The config adds one option, ``--ffn-gate-activation``, to vaswani's (no ``from __future__ import
annotations`` here: fairseq builds its argument parser from the real field types).
"""

from dataclasses import dataclass, field

from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from torch import nn

from user_plugin.models.architectures import set_default, set_dims
from user_plugin.models.decoder import VaswaniDecoder
from user_plugin.models.encoder import VaswaniEncoder
from user_plugin.models.transformer_config import VaswaniTransformerConfig
from user_plugin.models.vaswani_transformer import VaswaniTransformerModel
from user_plugin.modules.decoder_layer import DecoderLayer
from user_plugin.modules.encoder_layer import EncoderLayer

from ..gated_feed_forward import GatedFeedForward

MODEL_NAME = "gated_ffn_transformer"
GateActivationChoice = ChoiceEnum(utils.get_available_activation_fns())


@dataclass
class GatedFFNTransformerConfig(VaswaniTransformerConfig):
    ffn_gate_activation: GateActivationChoice = field(  # type: ignore[valid-type]
        default="gelu",
        metadata={"help": "activation of the gated FFN's first branch: gelu (GEGLU), relu "
                  "(ReGLU), linear (bilinear)"},
    )


class GatedEncoderLayer(EncoderLayer):
    """vaswani's encoder layer (§3.1) with the gated feed-forward block."""

    def build_feed_forward(self, cfg) -> nn.Module:
        return GatedFeedForward(
            cfg.encoder_embed_dim,
            cfg.encoder_ffn_embed_dim,
            activation_fn=str(cfg.ffn_gate_activation),
            activation_dropout=cfg.activation_dropout,
        )


class GatedDecoderLayer(DecoderLayer):
    """vaswani's decoder layer (§3.1) with the gated feed-forward block."""

    def build_feed_forward(self, cfg) -> nn.Module:
        return GatedFeedForward(
            cfg.decoder_embed_dim,
            cfg.decoder_ffn_embed_dim,
            activation_fn=str(cfg.ffn_gate_activation),
            activation_dropout=cfg.activation_dropout,
        )


class GatedEncoder(VaswaniEncoder):
    def build_layer(self, cfg) -> nn.Module:
        return GatedEncoderLayer(cfg)


class GatedDecoder(VaswaniDecoder):
    def build_layer(self, cfg) -> nn.Module:
        return GatedDecoderLayer(cfg)


@register_model(MODEL_NAME, dataclass=GatedFFNTransformerConfig)
class GatedFFNTransformerModel(VaswaniTransformerModel):
    """The Transformer (Figure 1) with gated feed-forward blocks in both stacks."""

    @classmethod
    def build_encoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> GatedEncoder:
        return GatedEncoder(cfg, dictionary, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, dictionary, embed_tokens: nn.Embedding) -> GatedDecoder:
        return GatedDecoder(cfg, dictionary, embed_tokens)


@register_model_architecture(MODEL_NAME, "gated_ffn_base")
def gated_ffn_base(args) -> None:
    """The base model (Table 3) with a GEGLU feed-forward of inner size 1365 = 2/3 * 2048, which
    keeps the base model's parameter count."""
    set_default(args, "ffn_gate_activation", "gelu")
    set_dims(args, layers=6, embed_dim=512, ffn_dim=1365, heads=8, dropout=0.1)
