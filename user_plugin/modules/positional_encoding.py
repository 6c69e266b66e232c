"""Positional information added to the embeddings at the bottom of both stacks (paper §3.5).

Two interchangeable modules share one interface, ``forward(positions) -> [*, embed_dim]``:

* :class:`SinusoidalPositionalEncoding`, the paper's fixed encoding with *interleaved* sine and
  cosine channels, ``PE(pos, 2i) = sin(pos / 10000^(2i/d))`` and ``PE(pos, 2i+1) = cos(...)``;
* :class:`LearnedPositionalEmbedding`, the learned alternative of Table 3 row E.

Positions count real tokens only, from 0, so left- or right-padding never shifts them
(:func:`token_positions`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..files.errors import InvalidValue


def token_positions(tokens: Tensor, padding_idx: int) -> Tensor:
    """Return the 0-based position of every non-pad token in ``tokens`` ([B, T]); pads get 0.

    Counting only real tokens makes positions independent of where the padding sits.
    """
    is_token = tokens.ne(padding_idx)
    return (torch.cumsum(is_token, dim=1) - 1).clamp_(min=0) * is_token


def sinusoidal_table(num_positions: int, embed_dim: int) -> Tensor:
    """The §3.5 table: row ``pos`` has ``sin(pos / 10000^(2i/d))`` at column 2i, ``cos`` at 2i+1."""
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, embed_dim, 2, dtype=torch.float64)
    angle = position / torch.pow(10000.0, two_i / embed_dim)
    table = torch.zeros(num_positions, embed_dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : embed_dim // 2])
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal encoding of §3.5 (no parameters; the table is not saved in checkpoints)."""

    def __init__(self, embed_dim: int, max_positions: int) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.max_positions = max_positions
        self.register_buffer("table", sinusoidal_table(max_positions, embed_dim), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        return self.table[positions]


class LearnedPositionalEmbedding(nn.Module):
    """Learned position vectors (Table 3 row E), initialised like the token embeddings."""

    def __init__(self, embed_dim: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.weight = nn.Parameter(torch.empty(max_positions, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=embed_dim**-0.5)

    def forward(self, positions: Tensor) -> Tensor:
        return self.weight[positions]


def check_length(length: int, max_positions: int, option: str) -> None:
    """Refuse a sequence longer than the position table with a message naming the option."""
    if length > max_positions:
        raise InvalidValue(
            f"a sequence of {length} tokens exceeds the model's {max_positions} positions "
            f"({option}); fairseq skips such sentences with --skip-invalid-size-inputs-valid-test"
        )


def build_positional_encoding(embed_dim: int, max_positions: int, learned: bool) -> nn.Module:
    """Sinusoidal (paper default) or learned (Table 3 row E) positional information."""
    if learned:
        return LearnedPositionalEmbedding(embed_dim, max_positions)
    return SinusoidalPositionalEncoding(embed_dim, max_positions)


__all__ = [
    "LearnedPositionalEmbedding",
    "SinusoidalPositionalEncoding",
    "build_positional_encoding",
    "check_length",
    "sinusoidal_table",
    "token_positions",
]
