"""Model FLOPs of training the encoder-decoder Transformer: the numerator of an MFU figure.

The one formula every benchmark of the project uses (the GPU check's MFU, ``scripts/
benchmark.py``'s TFLOP/s). A multiply-add counts 2 FLOPs; the backward pass costs twice the
forward (its two matrix products per forward product), so a training step is 3 x forward;
nothing is recomputed. Only matrix products count (embedding lookups, LayerNorm, softmax,
dropout and the optimizer are left out). With d = d_model, f = d_ff, V the vocabulary, N_e and
N_d the layer counts, and the sums over the sentences of a batch or corpus (S_i, T_i: source
and target lengths)::

    forward = N_e (8 d^2 + 4 d f) sum S_i          encoder: Q, K, V, output projections; FFN
            + N_e 4 d sum S_i^2                      encoder self-attention: Q K^T and A V
            + N_d (12 d^2 + 4 d f) sum T_i           decoder: self-attention projections (8 d^2),
                                                     encoder-decoder Q and output (4 d^2); FFN
            + N_d 4 d sum T_i^2                      decoder self-attention, the full T x T
                                                     product, as the kernels compute it
            + N_d 4 d sum S_i T_i                    encoder-decoder attention
            + N_d 4 d^2 sum S_i                      encoder-decoder K, V projections
            + 2 d V sum T_i                          pre-softmax linear
    training FLOPs = 3 x forward

:data:`FORMULA` holds this text for reports. Counted on the real lengths, this is the model's
useful work (padding is not counted); :meth:`TokenCounts.of_padded_batch` counts a padded
batch's shapes instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

FORMULA = (
    "training FLOPs = 3 x forward; forward = N_e (8d^2 + 4 d d_ff) sum S + N_e 4d sum S^2 "
    "+ N_d (12d^2 + 4 d d_ff) sum T + N_d 4d sum T^2 + N_d 4d sum S*T + N_d 4d^2 sum S "
    "+ 2 d V sum T (a multiply-add = 2 FLOPs; S, T: each sentence's source and target "
    "lengths; matrix products only)"
)


@dataclass(frozen=True)
class TransformerShape:
    """The sizes the FLOPs depend on."""

    encoder_layers: int
    decoder_layers: int
    d_model: int
    d_ff: int
    vocabulary: int


@dataclass(frozen=True)
class TokenCounts:
    """Sums over sentences: tokens per side, and the products that attention's cost follows."""

    source_tokens: float  # sum S_i
    target_tokens: float  # sum T_i
    source_squares: float  # sum S_i^2
    target_squares: float  # sum T_i^2
    source_target: float  # sum S_i T_i

    @classmethod
    def of_lengths(cls, source: Iterable[int], target: Iterable[int]) -> "TokenCounts":
        """The sums over pairs of (source, target) lengths."""
        s_sum = t_sum = ss = tt = st = 0.0
        for s, t in zip(source, target):
            s, t = float(s), float(t)
            s_sum, t_sum, ss, tt, st = s_sum + s, t_sum + t, ss + s * s, tt + t * t, st + s * t
        return cls(s_sum, t_sum, ss, tt, st)

    @classmethod
    def of_padded_batch(cls, sentences: int, source_length: int, target_length: int
                        ) -> "TokenCounts":
        """A batch's padded shapes: ``sentences`` rows of ``source_length`` and
        ``target_length`` positions."""
        b, s, t = float(sentences), float(source_length), float(target_length)
        return cls(b * s, b * t, b * s * s, b * t * t, b * s * t)

    def __add__(self, other: "TokenCounts") -> "TokenCounts":
        return TokenCounts(*(a + b for a, b in zip(
            (self.source_tokens, self.target_tokens, self.source_squares, self.target_squares,
             self.source_target),
            (other.source_tokens, other.target_tokens, other.source_squares,
             other.target_squares, other.source_target))))


def forward_flops(shape: TransformerShape, tokens: TokenCounts) -> float:
    """FLOPs of the forward pass over ``tokens`` (module description)."""
    d, f = float(shape.d_model), float(shape.d_ff)
    n_e, n_d = shape.encoder_layers, shape.decoder_layers
    return (n_e * (8 * d * d + 4 * d * f) * tokens.source_tokens
            + n_e * 4 * d * tokens.source_squares
            + n_d * (12 * d * d + 4 * d * f) * tokens.target_tokens
            + n_d * 4 * d * tokens.target_squares
            + n_d * 4 * d * tokens.source_target
            + n_d * 4 * d * d * tokens.source_tokens
            + 2 * d * shape.vocabulary * tokens.target_tokens)


def training_flops(shape: TransformerShape, tokens: TokenCounts) -> float:
    """FLOPs of a training step (forward and backward) over ``tokens``: 3 x forward."""
    return 3.0 * forward_flops(shape, tokens)


def training_flops_per_target_token(shape: TransformerShape, tokens: TokenCounts) -> float:
    """Training FLOPs per target token, for a corpus (or batch) with these sums."""
    return training_flops(shape, tokens) / tokens.target_tokens


def mfu(target_tokens_per_s: float, flops_per_target_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak FLOP/s."""
    return target_tokens_per_s * flops_per_target_token / peak_flops
