"""The label-smoothed loss of paper §5.4 in terms of logits: its two coefficients and its gradient.

With ``eps`` spread over the ``V - 1`` non-reference types (fairseq's definition), a row with
logits ``z``, log-normaliser ``lse`` and reference ``y`` has loss
``a (lse - z_y) + b (V lse - sum_v z_v)`` with ``a = 1 - eps - b`` and ``b = eps / (V - 1)``,
and gradient ``dL/dz_v = (a + bV) softmax(z)_v - b - a [v = y]``. Both the logits path
(:mod:`~user_plugin.criterions.label_smoothed_cross_entropy`) and the fused pre-softmax path
(:mod:`~user_plugin.criterions.fused_projection_loss`) use these.
"""

from typing import Tuple, Union

from torch import Tensor


def smoothing_coefficients(epsilon: float, vocab: int) -> Tuple[float, float]:
    """``(a, b)``: the weight of the reference's NLL and of each type's ``-log p``."""
    eps_other = epsilon / (vocab - 1) if vocab > 1 else 0.0
    return 1.0 - epsilon - eps_other, eps_other


def logit_gradient_(
    exp_scores: Tensor,
    target: Tensor,
    coefficients: Tuple[float, float],
    softmax_scale: Union[Tensor, float],
    row_scale: Union[Tensor, float] = 1.0,
) -> Tensor:
    """``dL/dz`` written over ``exp_scores`` ``[N, V]`` (float32), returned.

    ``exp_scores * softmax_scale`` must be ``softmax(z)`` (``exp(z - lse)`` with scale 1, or
    ``exp(z - max)`` with scale ``1 / sum``); every row's gradient is multiplied by
    ``row_scale`` (a number or ``[N, 1]``). ``target``: ``[N, 1]`` reference indices.
    """
    on_target, eps_other = coefficients
    vocab = exp_scores.size(-1)
    exp_scores.mul_(softmax_scale * row_scale * (on_target + eps_other * vocab))
    exp_scores.sub_(row_scale * eps_other)
    on_reference = exp_scores.new_full(target.shape, -on_target) * row_scale
    return exp_scores.scatter_add_(-1, target, on_reference)
