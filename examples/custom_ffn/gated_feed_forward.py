"""A gated feed-forward block to put in place of the paper's FFN (§3.3).

The paper's block is ``max(0, x W1 + b1) W2 + b2``. The gated linear unit variants of Shazeer
(2020, "GLU Variants Improve Transformer") multiply the activated branch by a second, linear one:

    ``FFN_gated(x) = (act(x W1 + b1) * (x V + c)) W2 + b2``

with ``act`` = GELU (GEGLU), ReLU (ReGLU) or the identity (bilinear). ``V`` and ``c`` are the
extra weights (``fc_gate``). With an inner size of 2/3 d_ff the block has the parameters of the
paper's one.
"""

import torch.nn.functional as F
from torch import Tensor, nn

from user_plugin.modules.feed_forward import PositionWiseFeedForward


class GatedFeedForward(PositionWiseFeedForward):
    """``(act(x W1 + b1) * (x V + c)) W2 + b2`` at every position alike: the paper's block
    (``fc1``, ``fc2``, the activation and its dropout) with a gate ``fc_gate``."""

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        activation_fn: str = "gelu",
        activation_dropout: float = 0.0,
    ) -> None:
        super().__init__(embed_dim, ffn_dim, activation_fn, activation_dropout)
        self.fc_gate = nn.Linear(embed_dim, ffn_dim)
        for layer in (self.fc1, self.fc_gate, self.fc2):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.activation(self.fc1(x)) * self.fc_gate(x)
        hidden = F.dropout(hidden, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden)
