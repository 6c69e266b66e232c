"""The pre-softmax linear (paper §3.4) and the label-smoothed loss (§5.4), fused in row chunks.

Training computes ``z = h W^T`` (``[tokens x V]`` logits), the loss, and the gradient
``dL/dz`` (another ``[tokens x V]`` tensor) before ``dL/dh = dL/dz W`` and
``dL/dW = dL/dz^T h``. At the paper's sizes these two tensors are the largest of a training step
(25k tokens x 37k types: 3.7 GB each in float32), and on a CPU every fresh allocation of that
size also costs page faults.

Here the rows are processed a chunk at a time: logits of the chunk, their log-normaliser, the
loss terms, the chunk's ``dL/dz`` in place of its logits, and its contribution to ``dL/dh`` and
``dL/dW``. Only ``[chunk x V]`` is ever held, in buffers made once per call and reused by
every chunk (a float32 one, plus one in the products' dtype when that is bf16): no chunk
allocates, converts or accumulates through a fresh tensor of that size. The matrix products
are the same as unfused (no recomputation). Because the gradients are produced during the
forward pass, this is only done when a gradient is wanted; the backward pass scales them by the
incoming gradient.

The loss and its gradient are those of :mod:`user_plugin.criterions.label_smoothing`
(fairseq's definition).
Pad rows must be removed by the caller (they contribute nothing and cost a full row of logits).
The gradients are formed before the loss scale of float16 training is known, so the criterion
does not use this with float16 weights or float16 autocast (bfloat16 is fine).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .label_smoothing import logit_gradient_, smoothing_coefficients

# elements of the [chunk x V] float32 logits held at once: 16 MB on a CPU keeps the chunk
# below glibc's mmap threshold (reused, no page faults); a GPU prefers fewer, larger products
CHUNK_ELEMENTS = {"cpu": 4 * 2**20, "cuda": 64 * 2**20}
MIN_CHUNK_ROWS = 64


def fused_projection_label_smoothed_loss(
    features: Tensor,
    weight: Tensor,
    target: Tensor,
    epsilon: float,
    count_correct: bool = False,
    chunk_rows: Optional[int] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Summed label-smoothed loss, summed NLL and the number of argmax hits of ``features @
    weight.T``.

    Args:
        features: ``[N, d]`` decoder outputs of the non-pad target positions.
        weight: ``[V, d]`` pre-softmax weight (the shared embedding with §3.4's tying).
        target: ``[N]`` reference tokens.
        epsilon: label smoothing (0.1 in the paper).
        count_correct: also count rows whose highest logit is the reference (else 0).
        chunk_rows: rows per chunk (default: from ``CHUNK_ELEMENTS``).

    The NLL and the count carry no gradient.
    """
    if features.dim() != 2 or weight.dim() != 2 or features.size(1) != weight.size(1):
        raise ValueError(
            f"features [N, d] and weight [V, d] expected, got {tuple(features.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if target.shape != features.shape[:1]:
        raise ValueError(f"target [{features.size(0)}] expected, got {tuple(target.shape)}")
    if chunk_rows is None:
        budget = CHUNK_ELEMENTS.get(features.device.type, CHUNK_ELEMENTS["cuda"])
        chunk_rows = max(MIN_CHUNK_ROWS, budget // max(1, weight.size(0)))
    return _FusedProjectionLoss.apply(
        features, weight, target, float(epsilon), bool(count_correct), int(chunk_rows)
    )


class _FusedProjectionLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, target, epsilon, count_correct, chunk_rows):
        rows, vocab = features.size(0), weight.size(0)
        coefficients = smoothing_coefficients(epsilon, vocab)
        on_target, eps_other = coefficients
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        loss = features.new_zeros((), dtype=torch.float32)
        nll = features.new_zeros((), dtype=torch.float32)
        correct = torch.zeros((), dtype=torch.long, device=features.device)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_grad else None
        # the products run in one dtype (autocast's, if on); every [chunk x V] tensor lives in
        # buffers made once, so a chunk allocates nothing of that size
        dtype = _product_dtype(features, weight)
        with torch.autocast(features.device.type, enabled=False):
            features_c, weight_c = features.to(dtype), weight.to(dtype)
            grad_features = torch.empty_like(features_c) if want_grad else None
            chunk = min(chunk_rows, rows)
            logits = features.new_empty((chunk, vocab), dtype=torch.float32)
            low = None if dtype == torch.float32 else logits.new_empty((chunk, vocab), dtype=dtype)
            grad_weight_chunk = None
            if want_grad and low is not None:
                grad_weight_chunk = torch.empty_like(weight_c)
            for start in range(0, rows, chunk_rows):
                stop = min(start + chunk_rows, rows)
                h = features_c[start:stop]
                y = target[start:stop].unsqueeze(-1)
                z = logits[: stop - start]
                if low is None:
                    torch.mm(h, weight_c.t(), out=z)
                else:
                    z.copy_(torch.mm(h, weight_c.t(), out=low[: stop - start]))
                # every pass over the [chunk x V] buffer is in place: sums first, then softmax
                target_logit = z.gather(-1, y)
                logit_sum = z.sum(dim=-1, keepdim=True)
                if count_correct:
                    correct += z.argmax(dim=-1).eq(y.squeeze(-1)).sum()
                shift = z.amax(dim=-1, keepdim=True)
                exp_sum = z.sub_(shift).exp_().sum(dim=-1, keepdim=True)
                log_normalizer = shift + exp_sum.log()
                chunk_nll = (log_normalizer - target_logit).sum()
                nll += chunk_nll
                loss += on_target * chunk_nll + eps_other * ((vocab * log_normalizer).sum()
                                                             - logit_sum.sum())
                if not want_grad:
                    continue
                # z now holds exp(z - shift): softmax = z / exp_sum
                grad = logit_gradient_(z, y, coefficients, 1.0 / exp_sum)
                if low is not None:
                    grad = low[: stop - start].copy_(grad)
                torch.mm(grad, weight_c, out=grad_features[start:stop])
                if grad_weight_chunk is None:
                    grad_weight.addmm_(grad.t(), h)
                else:
                    grad_weight += torch.mm(grad.t(), h, out=grad_weight_chunk)
        if grad_features is not None:
            grad_features = grad_features.to(features.dtype)  # autocast's products: back
        ctx.grads = (grad_features, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(nll, correct)
        return loss, nll, correct

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss, grad_nll, grad_correct):
        grad_features, grad_weight = ctx.grads
        ctx.grads = None
        scale = grad_loss.float()
        if grad_features is not None:
            grad_features = grad_features.mul_(scale.to(grad_features.dtype))
            grad_weight = grad_weight.mul_(scale).to(ctx.weight_dtype)
        return grad_features, grad_weight, None, None, None, None


def _product_dtype(features: Tensor, weight: Tensor) -> torch.dtype:
    """The dtype the chunk's matrix products run in: autocast's where it is on, else the
    inputs' common dtype."""
    device = features.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(features.dtype, weight.dtype)
