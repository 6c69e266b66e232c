"""Position-wise feed-forward network (paper §3.3): ``FFN(x) = max(0, x W1 + b1) W2 + b2``."""

from __future__ import annotations

from typing import Callable

from fairseq import utils
from torch import Tensor, nn

from .dropout import dropout


class PositionWiseFeedForward(nn.Module):
    """Two linear maps with an activation between them, applied to each position alike.

    ``activation_fn`` is ReLU in the paper; any name fairseq knows (``gelu``, ``swish``...) works.
    ``activation_dropout`` drops units after the activation (0 in the paper). Both linear maps
    keep PyTorch's default initialisation (uniform in +-1/sqrt(fan_in), biases too), as fairseq's
    transformer does; see :meth:`.attention.MultiHeadAttention.reset_parameters`.
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        activation_fn: str = "relu",
        activation_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.activation: Callable[[Tensor], Tensor] = utils.get_activation_fn(activation_fn)
        self.activation_dropout = activation_dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.fc1(x))
        hidden = dropout(hidden, self.activation_dropout, self.training)
        return self.fc2(hidden)
