"""Model ``gated_ffn_transformer``: vaswani's Transformer with a gated feed-forward block.

Only the feed-forward sub-layer changes (§3.3); attention, residual wrapping, embeddings and
decoding are vaswani's. The whole change is one subclass of vaswani's blocks that overrides one
method (``build_feed_forward``), named by a model; one option (``--ffn-gate-activation``); and
one architecture.

(No ``from __future__ import annotations`` here: fairseq builds its argument parser from the
config's real field types.)
"""

from dataclasses import dataclass, field

from fairseq import utils
from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model, register_model_architecture
from torch import nn

from user_plugin.models.architectures import set_default, set_dims
from user_plugin.models.blocks import TransformerBlocks
from user_plugin.models.transformer_config import StackConfig, VaswaniTransformerConfig
from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

from ..gated_feed_forward import GatedFeedForward

GateActivationChoice = ChoiceEnum(utils.get_available_activation_fns())


@dataclass
class GatedFFNTransformerConfig(VaswaniTransformerConfig):
    ffn_gate_activation: GateActivationChoice = field(  # type: ignore[valid-type]
        default="gelu",
        metadata={"help": "activation of the gated FFN's first branch: gelu (GEGLU), relu "
                  "(ReGLU), linear (bilinear)"},
    )


class GatedFFNBlocks(TransformerBlocks):
    """vaswani's blocks with gated feed-forward networks in both stacks."""

    def build_feed_forward(self, stack: StackConfig) -> nn.Module:
        return GatedFeedForward(
            stack.embed_dim,
            stack.ffn_embed_dim,
            activation_fn=str(stack.cfg.ffn_gate_activation),
            activation_dropout=stack.activation_dropout,
        )


@register_model("gated_ffn_transformer", dataclass=GatedFFNTransformerConfig)
class GatedFFNTransformerModel(VaswaniTransformerModel):
    """The Transformer (Figure 1) with gated feed-forward blocks in both stacks."""

    blocks = GatedFFNBlocks()


@register_model_architecture("gated_ffn_transformer", "gated_ffn_base")
def gated_ffn_base(args) -> None:
    """The base model (Table 3) with a GEGLU feed-forward of inner size 1365 = 2/3 * 2048, which
    keeps the base model's parameter count."""
    set_default(args, "ffn_gate_activation", "gelu")
    set_dims(args, layers=6, embed_dim=512, ffn_dim=1365, heads=8, dropout=0.1)
