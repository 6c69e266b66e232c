"""The residual wrapping of every sub-layer (paper §3.1, §5.4).

Post-norm, the paper's form: ``LayerNorm(x + Dropout(Sublayer(x)))``.
Pre-norm, a common option for deep or big models: ``x + Dropout(Sublayer(LayerNorm(x)))``
(the stack then ends with one more LayerNorm; see the encoder and decoder).
"""

from __future__ import annotations

from torch import Tensor, nn

from .dropout import dropout


class AddAndNorm(nn.Module):
    """Holds one sub-layer's LayerNorm and residual dropout and knows where to apply them."""

    def __init__(self, embed_dim: int, dropout: float, normalize_before: bool = False) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(embed_dim)
        self.dropout = dropout
        self.normalize_before = normalize_before

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: x itself (post-norm) or LayerNorm(x) (pre-norm)."""
        return self.layer_norm(x) if self.normalize_before else x

    def forward(self, residual: Tensor, sublayer_output: Tensor) -> Tensor:
        """Dropout on the sub-layer output, add the residual, then normalise (post-norm)."""
        x = residual + dropout(sublayer_output, self.dropout, self.training)
        return x if self.normalize_before else self.layer_norm(x)
