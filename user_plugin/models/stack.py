"""What the encoder and decoder stacks share (paper §3.1, §3.4, §3.5, §5.4).

Both stacks read ``x = Dropout(sqrt(d_model) * Embed(tokens) + PE(positions))``, run N
identical layers, and end with one more LayerNorm when the layers are pre-norm. The encoder and
the decoder inherit this once and add only what differs: the decoder's masks, incremental
decoding and pre-softmax linear.
"""

from __future__ import annotations

import math
from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from .transformer_config import StackConfig


def default_blocks():
    """The paper's blocks: the factories of ``VaswaniTransformerModel`` (imported late, since
    the model module imports the stacks)."""
    from .vaswani_transformer import VaswaniTransformerModel

    return VaswaniTransformerModel


class TransformerStack:
    """Embedding, N layers and the final LayerNorm of one stack (a mixin of the fairseq
    encoder / decoder classes; parameter names are ``embed_tokens``, ``embed_positions``,
    ``layers.<i>`` and ``layer_norm``)."""

    stack: StackConfig
    layers: nn.ModuleList

    def build_stack(
        self,
        stack: StackConfig,
        embed_tokens: nn.Embedding,
        blocks,
        build_layer: Callable[[StackConfig], nn.Module],
    ) -> None:
        """Create the stack's modules (call from ``__init__`` after the fairseq base class's).

        ``blocks`` builds the positional encoding (``build_positional_encoding(stack)``);
        ``build_layer(stack)`` one layer.
        """
        self.stack = stack
        self.padding_idx = embed_tokens.padding_idx
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(stack.embed_dim) if stack.scale_embedding else 1.0
        self.embed_positions = blocks.build_positional_encoding(stack)
        self.dropout = stack.dropout
        self.layers = nn.ModuleList([build_layer(stack) for _ in range(stack.layers)])
        self.layer_norm = nn.LayerNorm(stack.embed_dim) if stack.normalize_before else None

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """``Dropout(sqrt(d_model) * Embed(tokens) + PE(positions))`` (§3.4, §3.5, §5.4)."""
        x = self.embed_scale * self.embed_tokens(tokens)
        x = x + self.embed_positions(positions).to(x)
        return F.dropout(x, p=self.dropout, training=self.training)

    def final_norm(self, x: Tensor) -> Tensor:
        """The last LayerNorm of a pre-norm stack; post-norm layers already end normalized."""
        return x if self.layer_norm is None else self.layer_norm(x)

    def max_positions(self) -> int:
        return self.stack.max_positions
