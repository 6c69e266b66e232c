"""A gated feed-forward block to put in place of the paper's FFN (§3.3).

The paper's block is ``max(0, x W1 + b1) W2 + b2``. The gated linear unit variants of Shazeer
(2020, "GLU Variants Improve Transformer") multiply the activated branch by a second, linear one:

    ``FFN_gated(x) = (act(x W1 + b1) * (x V + c)) W2 + b2``

with ``act`` = GELU (GEGLU), ReLU (ReGLU) or the identity (bilinear). ``V`` and ``c`` are the
extra weights (``fc_gate``). With an inner size of 2/3 d_ff the block has the parameters of the
paper's one.
"""

from collections.abc import Callable

import torch.nn.functional as F
from fairseq import utils
from torch import Tensor, nn


class GatedFeedForward(nn.Module):
    """``(act(x W1 + b1) * (x V + c)) W2 + b2`` at every position alike."""

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        activation_fn: str = "gelu",
        activation_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc_gate = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.activation: Callable[[Tensor], Tensor] = utils.get_activation_fn(activation_fn)
        self.activation_dropout = activation_dropout
        for layer in (self.fc1, self.fc_gate, self.fc2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.fc1(x)) * self.fc_gate(x)
        hidden = F.dropout(hidden, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden)
