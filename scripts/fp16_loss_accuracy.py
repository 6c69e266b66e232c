#!/usr/bin/env python
"""How exact are the gradients of the label-smoothed loss (paper §5.4) through the pre-softmax
linear (§3.4) in float16, along each of the criterion's paths?

float16 training scales the loss by S (fairseq's dynamic loss scale) so that small gradients do
not underflow float16's range (smallest normal number 6.1e-5). The criterion
(``user_plugin/criterions``) has two paths:

* ``unfused``: float16 logits, then the loss; autograd forms ``dL/dz`` from the scaled loss,
  so its small entries are multiplied by S before they are rounded to float16. This is the path
  the criterion takes in float16.
* ``fused``: the chunked projection + loss of ``fused_projection_loss``, which forms ``dL/dz``
  during the forward pass, before S is known, rounds it to float16 unscaled, and multiplies the
  products by S afterwards. The criterion takes it in float32 and bfloat16.

A third, ``fused-in-backward``, written here only for comparison: the same chunks, with
``dL/dz`` formed in the backward pass (logits computed again), where S is known.

Every path gets float16 inputs; the reference is float64 on the same rounded inputs. The
features are ``N(0, 1)`` rows (a layer norm's output), the weights ``N(0, (logit_scale^2 /
d))``, and each row's reference is its highest logit (a model that has learned something, with
peaked softmaxes). Reported: relative error (Frobenius) of ``dL/dh`` and ``dL/dW``, and the
median relative error of the rows of ``dL/dW`` of types that are no row's reference. Adam
normalises every parameter's update by its own gradient history, so those small rows (most of
the vocabulary) matter as much as the large ones.

    python scripts/fp16_loss_accuracy.py                # d 256, N 1024, V 8000 and 32000
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")

from user_plugin.files import UserError, run_main  # noqa: E402

PATHS = ("unfused", "fused", "fused-in-backward")
EPSILON = 0.1
CHUNK_ROWS = 256


def _fused_in_backward(features, weight, target, loss_scale: float):
    """Gradients (dL/dh, dL/dW) of ``loss_scale`` x the loss, dL/dz formed per chunk from
    recomputed logits with the scale applied before the float16 rounding."""
    from user_plugin.criterions.label_smoothing import logit_gradient_, smoothing_coefficients

    coefficients = smoothing_coefficients(EPSILON, weight.size(0))
    grad_features = torch.empty_like(features)
    grad_weight = torch.zeros_like(weight, dtype=torch.float32)
    for start in range(0, features.size(0), CHUNK_ROWS):
        h = features[start: start + CHUNK_ROWS]
        z = F.linear(h, weight).float()
        softmax = z.sub_(z.logsumexp(dim=-1, keepdim=True)).exp_()
        grad = logit_gradient_(softmax, target[start: start + CHUNK_ROWS, None], coefficients,
                               1.0, loss_scale).to(features.dtype)
        grad_features[start: start + CHUNK_ROWS] = grad @ weight
        grad_weight += (grad.t() @ h).float()
    return grad_features, grad_weight.to(weight.dtype)


def gradient_errors(rows: int, dim: int, vocab: int, loss_scale: float, logit_scale: float = 8.0,
                    seed: int = 0) -> Dict[str, Dict[str, float]]:
    """For each path of :data:`PATHS`: ``{"dh", "dW", "dW_other_rows"}`` relative errors
    against float64 (``inf`` where the scaled float16 gradients overflowed)."""
    from user_plugin.criterions.fused_projection_loss import fused_projection_label_smoothed_loss
    from user_plugin.criterions.label_smoothed_cross_entropy import (
        label_smoothed_loss_from_logits,
    )

    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, dim, generator=generator).half()
    weight = (torch.randn(vocab, dim, generator=generator) * logit_scale / dim ** 0.5).half()
    target = (features.float() @ weight.float().t()).argmax(dim=-1)

    def autograd_grads(loss_fn, dtype):
        h = features.to(dtype, copy=True).requires_grad_()
        w = weight.to(dtype, copy=True).requires_grad_()
        (loss_fn(h, w) * (loss_scale if dtype == torch.float16 else 1.0)).backward()
        return h.grad, w.grad

    reference = autograd_grads(
        lambda h, w: label_smoothed_loss_from_logits(h @ w.t(), target, EPSILON, -1)[0],
        torch.float64)
    grads = {
        "unfused": autograd_grads(
            lambda h, w: label_smoothed_loss_from_logits(F.linear(h, w), target, EPSILON, -1)[0],
            torch.float16),
        "fused": autograd_grads(
            lambda h, w: fused_projection_label_smoothed_loss(h, w, target, EPSILON,
                                                              chunk_rows=CHUNK_ROWS)[0],
            torch.float16),
        "fused-in-backward": _fused_in_backward(features, weight, target, loss_scale),
    }
    other_rows = torch.ones(vocab, dtype=torch.bool)
    other_rows[target] = False
    out = {}
    for path, (grad_h, grad_w) in grads.items():
        grad_h, grad_w = grad_h.double() / loss_scale, grad_w.double() / loss_scale
        row_errors = ((grad_w[other_rows] - reference[1][other_rows]).norm(dim=1)
                      / reference[1][other_rows].norm(dim=1))
        out[path] = {
            "dh": float((grad_h - reference[0]).norm() / reference[0].norm()),
            "dW": float((grad_w - reference[1]).norm() / reference[1].norm()),
            "dW_other_rows": float(row_errors.median()),
        }
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fp16_loss_accuracy.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024, help="target tokens N")
    parser.add_argument("--dim", type=int, default=256, help="d_model")
    parser.add_argument("--vocab", default="8000,32000", help="vocabulary sizes V (comma list)")
    parser.add_argument("--loss-scale", default="1,128,2048",
                        help="loss scales S (comma list; fairseq starts at 128)")
    parser.add_argument("--logit-scale", type=float, default=8.0,
                        help="standard deviation of the logits")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _numbers(text: str, kind: type, name: str) -> List:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{name}: a comma list of numbers expected, got '{text}'") from None
    if not values or any(v <= 0 for v in values):
        raise UserError(f"{name}: positive numbers expected, got '{text}'")
    return values


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    vocabs = _numbers(args.vocab, int, "--vocab")
    scales = _numbers(args.loss_scale, float, "--loss-scale")
    if min(args.rows, args.dim) < 1:
        raise UserError("--rows and --dim must be positive")
    torch.set_num_threads(1)
    print(f"N {args.rows}, d {args.dim}, logits ~ N(0, {args.logit_scale:g}^2), eps {EPSILON}; "
          "relative error against float64")
    print("| V | loss scale | path | dL/dh | dL/dW | dL/dW, rows of non-reference types "
          "(median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for vocab in vocabs:
        for scale in scales:
            errors = gradient_errors(args.rows, args.dim, vocab, scale, args.logit_scale,
                                     args.seed)
            for path in PATHS:
                e = errors[path]
                print(f"| {vocab} | {scale:g} | {path} | {e['dh']:.2e} | {e['dW']:.2e} | "
                      f"{e['dW_other_rows']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, None, "fp16_loss_accuracy.py"))
