"""The blocks of the Transformer (paper §3), each made by one method of one factory object.

:class:`TransformerBlocks` builds every part inside the stacks: their layers (§3.1), attention
(§3.2), the feed-forward network (§3.3), embeddings (§3.4) and positions (§3.5). The model
(:class:`~.vaswani_transformer.VaswaniTransformerModel`) holds one as its ``blocks`` attribute
and hands it to its encoder and decoder; they ask it for their layers, the layers for their
sub-layers. Nothing else builds a block, so swapping one is one subclass that overrides one
method, named by a model (docs/extending.md, ``examples/custom_ffn``)::

    class GatedBlocks(TransformerBlocks):
        def build_feed_forward(self, stack):
            return MyFeedForward(stack.embed_dim, stack.ffn_embed_dim)

    @register_model("my_transformer", dataclass=VaswaniTransformerConfig)
    class MyTransformer(VaswaniTransformerModel):
        blocks = GatedBlocks()

``stack`` (a :class:`~.transformer_config.StackConfig`) holds one stack's options, with
``stack.side`` saying which stack asks and ``stack.cfg`` the whole configuration.
"""

from __future__ import annotations

from typing import Any, Dict

from torch import nn

from ..modules.attention import MultiHeadAttention
from ..modules.cross_self_attention import CrossSelfAttention
from ..modules.decoder_layer import DecoderLayer
from ..modules.encoder_layer import EncoderLayer
from ..modules.feed_forward import PositionWiseFeedForward
from ..modules.positional_encoding import build_positional_encoding
from .transformer_config import StackConfig


class TransformerBlocks:
    """The paper's blocks. Stateless: one instance serves every model of a class."""

    # -- the layers of the stacks (§3.1) ----------------------------------------------------

    def build_encoder_layer(self, stack: StackConfig) -> nn.Module:
        """One encoder layer (§3.1): self-attention and feed-forward."""
        return EncoderLayer(stack, blocks=self)

    def build_decoder_layer(self, stack: StackConfig) -> nn.Module:
        """One decoder layer (§3.1): masked self-attention, encoder-decoder attention and
        feed-forward."""
        return DecoderLayer(stack, blocks=self)

    # -- the blocks (§3.2-§3.5) -----------------------------------------------------------

    def build_embedding(self, dictionary, embed_dim: int) -> nn.Embedding:
        """Learned token embeddings (§3.4), N(0, d^-1/2) with a zero padding row."""
        embedding = nn.Embedding(len(dictionary), embed_dim, padding_idx=dictionary.pad())
        nn.init.normal_(embedding.weight, mean=0.0, std=embed_dim**-0.5)
        nn.init.zeros_(embedding.weight[dictionary.pad()])
        return embedding

    def build_positional_encoding(self, stack: StackConfig) -> nn.Module:
        """Sinusoids (§3.5) or learned positions (Table 3 row E)."""
        return build_positional_encoding(stack.embed_dim, stack.max_positions, stack.learned_pos)

    def build_self_attention(self, stack: StackConfig) -> nn.Module:
        """Multi-head self-attention (§3.2.2); masked in the decoder (§3.2.3)."""
        return MultiHeadAttention(**attention_sizes(stack))

    def build_encoder_attention(self, stack: StackConfig) -> nn.Module:
        """The decoder's encoder-decoder attention (§3.2.3)."""
        return MultiHeadAttention(
            **attention_sizes(stack), encoder_decoder=True, kv_dim=stack.cfg.encoder_embed_dim
        )

    def build_cross_self_attention(self, stack: StackConfig) -> nn.Module:
        """The decoder's self-attention over the encoder output and its own prefix together,
        replacing masked self-attention under ``--cross-self-attention`` (Peitz et al. 2019)."""
        return CrossSelfAttention(**attention_sizes(stack))

    def build_feed_forward(self, stack: StackConfig) -> nn.Module:
        """The position-wise feed-forward network (§3.3)."""
        return PositionWiseFeedForward(
            stack.embed_dim,
            stack.ffn_embed_dim,
            activation_fn=stack.activation_fn,
            activation_dropout=stack.activation_dropout,
        )


def attention_sizes(stack: StackConfig) -> Dict[str, Any]:
    """The arguments every attention of ``stack`` is built with: d_model, h, d_k, d_v (§3.2.2)
    and the dropout on attention probabilities."""
    return dict(
        embed_dim=stack.embed_dim,
        num_heads=stack.attention_heads,
        key_dim=stack.key_dim,
        value_dim=stack.value_dim,
        dropout=stack.attention_dropout,
    )
